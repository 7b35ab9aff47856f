"""The node's status page: live charts served beside `/metrics` on the same HTTP port.

`History` keeps a bounded record of the node's figures, one sample every
`SAMPLE_EVERY_S` seconds (the node's start-up task calls `record` with its status dict);
`PAGE` is one self-contained HTML document (inline script and SVG, no external assets,
so it works on a machine with no internet) that polls `/history.json` and draws:

- policy version over time;
- connected peers;
- throughput: the per-minute rate of the role's work counters (rollouts produced by a
  worker, audited by a validator, verified and trained by a trainer);
- credit and standing: a worker's delivered rollouts and standing factor, a trainer's
  verified and usable rollouts and banned producers;
- the learning curve of a trainer (held-out solve rate by policy version).

Each chart's `<svg>` carries `data-points` (how many points it drew), which is what the
page's test reads in headless Chromium. A chart with nothing to show for this role says so.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

SAMPLE_EVERY_S = 5.0
MAX_SAMPLES = 720  # one hour at SAMPLE_EVERY_S
MAX_FIGURES = 128  # numeric leaves kept per sample
MAX_LEARNING_POINTS = 500


def _figures(status: dict[str, Any]) -> dict[str, float]:
    """The numeric leaves of a status dict as `section.key` → value (at most MAX_FIGURES)."""
    out: dict[str, float] = {}

    def walk(prefix: str, value: Any, depth: int) -> None:
        if len(out) >= MAX_FIGURES:
            return
        if isinstance(value, bool):
            out[prefix] = float(value)
        elif isinstance(value, int | float):
            if math.isfinite(value):
                out[prefix] = float(value)
        elif isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)

    walk("", status, 0)
    return out


class History:
    """The last MAX_SAMPLES samples of a node's figures, oldest first."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.samples: deque[dict[str, float]] = deque(maxlen=max_samples)
        self.learning: list[dict[str, Any]] = []
        self.role = ""
        self._encoded: bytes | None = None  # to_json's answer until the next sample

    def record(self, now: float, status: dict[str, Any]) -> None:
        """Add one sample taken at `now` (unix seconds) from the node's status dict."""
        sample = _figures(status)
        sample["t"] = round(now, 3)
        self.samples.append(sample)
        self._encoded = None
        roles = status.get("roles")
        if isinstance(roles, list) and roles:
            self.role = "+".join(str(r) for r in roles)
        role_status = status.get("role_status")
        learning = role_status.get("learning") if isinstance(role_status, dict) else None
        if isinstance(learning, list):
            self.learning = [
                {k: p.get(k) for k in ("t", "version", "solve_rate", "reward_mean")}
                for p in learning[-MAX_LEARNING_POINTS:]
                if isinstance(p, dict)
            ]

    async def sample_forever(self, status: Callable[[], dict[str, Any]]) -> None:
        """Record `status()` every SAMPLE_EVERY_S seconds until cancelled."""
        while True:
            self.record(time.time(), status())
            await trio.sleep(SAMPLE_EVERY_S)

    def to_json(self) -> bytes:
        """The history as the page reads it: samples, learning points and the role; encoded
        once per sample, however many pages poll it."""
        if self._encoded is None:
            self._encoded = json.dumps(
                {"role": self.role, "samples": list(self.samples), "learning": self.learning},
                separators=(",", ":"),
            ).encode()
        return self._encoded


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>swarm-node</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .2em}#sub{color:#666;margin-bottom:1em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(420px,1fr));gap:1em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.7em}
.card h2{font-size:1em;margin:0 0 .4em}.empty{color:#999;font-style:italic}
.legend span{margin-right:1em;white-space:nowrap}.legend i{display:inline-block;width:.8em;
height:.8em;margin-right:.3em;vertical-align:-1px}
svg{width:100%;max-width:560px;height:190px}
</style></head><body>
<h1>swarm-node <span id="role"></span></h1>
<div id="sub">waiting for the first sample...</div>
<div class="grid">
<div class="card"><h2>Policy version</h2><div id="version"></div></div>
<div class="card"><h2>Connected peers</h2><div id="peers"></div></div>
<div class="card"><h2>Throughput (per minute)</h2><div id="throughput"></div></div>
<div class="card"><h2>Credit and standing</h2><div id="credit"></div></div>
<div class="card"><h2>Learning curve (held-out solve rate)</h2><div id="learning"></div></div>
</div>
<script>
"use strict";
const COLORS=["#1f77b4","#d62728","#2ca02c","#ff7f0e","#9467bd","#8c564b"];
// Counters whose per-minute rate is throughput, by the role that has them.
const RATES=[["role_status.produced","rollouts produced"],["role_status.passed","audits passed"],
["role_status.failed","audits failed"],["role_status.trained_verified","trained (audited)"],
["role_status.trained_unaudited","trained (unaudited)"],["role_status.train_steps","training steps"]];
const CREDIT=[["delivery.delivered","own rollouts delivered"],["role_status.standing_factor","standing factor"],
["role_status.credit","credited reward"],["role_status.verified","rollouts verified"],
["role_status.usable_at_version","usable at this version"],["role_status.producers_banned","producers banned"]];
function el(tag,attrs){const e=document.createElementNS("http://www.w3.org/2000/svg",tag);
for(const k in attrs)e.setAttribute(k,attrs[k]);return e}
function chart(id,series,xlabel){
  const box=document.getElementById(id);box.textContent="";
  const pts=series.reduce((n,s)=>n+s.points.length,0);
  const svg=el("svg",{viewBox:"0 0 420 182","data-points":String(pts),"data-series":String(series.length)});
  box.appendChild(svg);
  if(pts===0){const p=document.createElement("div");p.className="empty";
    p.textContent="nothing yet for this node";box.appendChild(p);return}
  const all=series.flatMap(s=>s.points);
  let x0=Math.min(...all.map(p=>p[0])),x1=Math.max(...all.map(p=>p[0]));
  let y0=Math.min(0,...all.map(p=>p[1])),y1=Math.max(...all.map(p=>p[1]));
  if(x1===x0)x1=x0+1;if(y1===y0)y1=y0+1;
  const X=x=>40+(x-x0)/(x1-x0)*370,Y=y=>160-(y-y0)/(y1-y0)*150;
  svg.appendChild(el("line",{x1:40,y1:160,x2:410,y2:160,stroke:"#888"}));
  svg.appendChild(el("line",{x1:40,y1:10,x2:40,y2:160,stroke:"#888"}));
  for(const [v,y] of [[y0,164],[y1,14]]){const t=el("text",{x:36,y:y,"text-anchor":"end","font-size":10});
    t.textContent=+v.toPrecision(3);svg.appendChild(t)}
  for(const [v,x,a] of [[x0,40,"start"],[x1,410,"end"]]){const t=el("text",{x:x,y:172,"text-anchor":a,"font-size":10});
    t.textContent=+v.toPrecision(3);svg.appendChild(t)}
  const xl=el("text",{x:225,y:178,"text-anchor":"middle","font-size":10});xl.textContent=xlabel;svg.appendChild(xl);
  series.forEach((s,i)=>{const c=COLORS[i%COLORS.length];
    svg.appendChild(el("polyline",{fill:"none",stroke:c,"stroke-width":1.5,
      points:s.points.map(p=>X(p[0]).toFixed(1)+","+Y(p[1]).toFixed(1)).join(" ")}));
    if(s.points.length===1){const p=s.points[0];svg.appendChild(el("circle",{cx:X(p[0]),cy:Y(p[1]),r:3,fill:c}))}});
  const lg=document.createElement("div");lg.className="legend";
  series.forEach((s,i)=>{const sp=document.createElement("span");const sw=document.createElement("i");
    sw.style.background=COLORS[i%COLORS.length];sp.appendChild(sw);
    sp.appendChild(document.createTextNode(s.name+": "+(+s.points[s.points.length-1]?.[1]?.toPrecision(4))));
    lg.appendChild(sp)});
  box.appendChild(lg);
}
function line(samples,key,t0){return samples.filter(s=>key in s).map(s=>[(s.t-t0)/60,s[key]])}
// Per-minute rate of a counter over the trailing RATE_WINDOW_S seconds (counters move in
// steps, so a rate between neighbouring samples is spiky).
const RATE_WINDOW_S=30;
// A counter not reported yet counts as 0 (a worker reports "produced" after its first batch).
function rate(samples,key,t0){const v=s=>s[key]||0;const out=[];let j=0;
  for(let i=0;i<samples.length;i++){const s=samples[i];
    while(j<i&&s.t-samples[j+1].t>=RATE_WINDOW_S)j++;
    const p=samples[j];if(s.t>p.t)out.push([(s.t-t0)/60,Math.max(0,(v(s)-v(p))/(s.t-p.t)*60)])}
  return out}
function draw(h){
  const s=h.samples;if(!s.length)return;const t0=s[0].t;const last=s[s.length-1];
  document.getElementById("role").textContent=h.role?"("+h.role+")":"";
  document.getElementById("sub").textContent=s.length+" samples over "+((last.t-t0)/60).toFixed(1)+
    " min; updated "+new Date(last.t*1000).toLocaleTimeString();
  const min="minutes since the page's first sample";
  chart("version",[{name:"policy version",points:line(s,"policy_version",t0)}].filter(x=>x.points.length),min);
  chart("peers",[{name:"peers",points:line(s,"peers",t0)}].filter(x=>x.points.length),min);
  chart("throughput",RATES.map(([k,n])=>({name:n,points:rate(s,k,t0)})).filter(x=>x.points.some(p=>p[1]>0)),min);
  chart("credit",CREDIT.map(([k,n])=>({name:n,points:line(s,k,t0)})).filter(x=>x.points.length),min);
  chart("learning",[{name:"solve rate",points:h.learning.filter(p=>p.solve_rate!=null).map(p=>[p.version,p.solve_rate])}]
    .filter(x=>x.points.length),"policy version");
}
async function poll(){
  try{const r=await fetch("history.json",{cache:"no-store"});if(r.ok)draw(await r.json())}
  catch(e){document.getElementById("sub").textContent="node not answering: "+e}
  setTimeout(poll,2000)}
poll();
</script></body></html>
"""
