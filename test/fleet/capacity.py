"""How many claims of each fleet template the published slices admit, from the slices alone.

Each template asks for one device of one kind and type; a device may consume from one counter
set. Per counter set, the claims it admits are the matching devices that consume from it,
bounded by its capacity over each device's consumption; devices without counters add one each.
Tainted devices (NoSchedule or NoExecute) admit nothing: the templates tolerate no taint. This is
exact for the fleet's kinds, where the templates' devices never share a counter set with another
template's devices that the same run allocates (whole GPUs on mdev nodes consume more than their
GPU's set holds once live vGPUs exist, so they admit nothing there).
"""

from workload import attribute

MATCH = {
    "gpu": lambda d: attribute(d, "type") == "gpu",
    "mdev": lambda d: attribute(d, "type") == "mdev" and attribute(d, "mdevType") == "nvidia-222",
    "vgpu": lambda d: attribute(d, "type") == "vgpu" and
    attribute(d, "vgpuTypeName") == "NVIDIA H100-20C",
    "vf": lambda d: attribute(d, "type") == "vf",
}


def admits(slices, template):
    match = MATCH[template]
    capacities, per_set, free = {}, {}, 0
    for s in slices:
        pool = s["spec"]["pool"]["name"]
        for c in s["spec"].get("sharedCounters", []):
            capacities[(pool, c["name"])] = {k: int(v["value"]) for k, v in c["counters"].items()}
        for d in s["spec"].get("devices", []):
            if not match(d) or any(t.get("effect") in ("NoSchedule", "NoExecute")
                                   for t in d.get("taints", [])):
                continue
            uses = d.get("consumesCounters", [])
            if not uses:
                free += 1
                continue
            use = uses[0]
            key = (pool, use["counterSet"])
            per_set.setdefault(key, []).append(
                {k: int(v["value"]) for k, v in use["counters"].items()})
    total = free
    for key, consumptions in per_set.items():
        capacity = capacities.get(key, {})
        fits = len(consumptions)
        for counter, value in consumptions[0].items():
            if value > 0:
                fits = min(fits, capacity.get(counter, 0) // value)
        total += fits
    return total
