// An unpatched js-libp2p 2.x peer for tests/test_node_interop.py.
// Usage: node peer.mjs <our multiaddr with /p2p/> <topic> <seconds>
// Dials the given node, reports identify, pings it every 2 s, follows <topic> and
// publishes one message there every 2 s, for <seconds>; then stops. Every report is one
// JSON line on stdout. Every wait is bounded.
import './polyfill.mjs' // first: evaluated before the libraries
import { gossipsub } from '@chainsafe/libp2p-gossipsub'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { ping } from '@libp2p/ping'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const [target, topic, secondsArg] = process.argv.slice(2)
const seconds = Number(secondsArg)
const say = (event, fields = {}) => console.log(JSON.stringify({ event, ...fields }))
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    ping: ping(),
    pubsub: gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: false })
  }
})
say('started', { peer: node.peerId.toString() })

node.addEventListener('peer:identify', (evt) => {
  const info = evt.detail
  say('identify', {
    peer: info.peerId.toString(),
    agent: info.agentVersion ?? '',
    protocols: info.protocols
  })
})
node.services.pubsub.addEventListener('message', (evt) => {
  const msg = evt.detail
  if (msg.topic !== topic) return
  say('message', {
    from: msg.type === 'signed' ? msg.from.toString() : '',
    data: new TextDecoder().decode(msg.data)
  })
})
node.services.pubsub.subscribe(topic)

const ma = multiaddr(target)
const connection = await node.dial(ma, { signal: AbortSignal.timeout(15000) })
say('connected', { peer: connection.remotePeer.toString(), protocol: connection.multiplexer ?? '' })

const end = Date.now() + seconds * 1000
let n = 0
while (Date.now() < end) {
  try {
    const rtt = await node.services.ping.ping(connection.remotePeer, { signal: AbortSignal.timeout(5000) })
    say('ping', { rtt })
  } catch (err) {
    say('ping_failed', { error: String(err) })
  }
  try {
    await node.services.pubsub.publish(topic, new TextEncoder().encode(`js ${n}`))
    say('published', { n })
    n += 1
  } catch (err) {
    say('publish_failed', { error: String(err) })
  }
  const streams = node.getConnections(connection.remotePeer).length
  say('tick', { connections: streams, meshsub: node.services.pubsub.getMeshPeers(topic).length })
  await sleep(2000)
}
say('done', { published: n })
await node.stop()
process.exit(0)
