"""Tasks and rewards, generation engines, the built-in tiny policy, RL losses and training."""
