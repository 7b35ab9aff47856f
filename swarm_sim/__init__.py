"""Virtual-time simulator driving the same `protocol` rules over many virtual peers."""
