#!/usr/bin/env python3
"""Prints the ResourceSlices of a pool as a readable table, like a person would read them from
`kubectl get resourceslices -o yaml`. Waits (up to 20 s) until the pool is complete, since the
plugin publishes in the background."""
import json
import sys
import time
import urllib.request

server, pool_name = sys.argv[1], sys.argv[2]
deadline = time.time() + 20
items = []
while time.time() < deadline:
    with urllib.request.urlopen(server + "/apis/resource.k8s.io/v1/resourceslices") as response:
        items = [s for s in json.load(response)["items"] if s["spec"]["pool"]["name"] == pool_name]
    if items and len(items) == items[0]["spec"]["pool"]["resourceSliceCount"]:
        break
    time.sleep(0.2)
if not items:
    sys.exit("no ResourceSlices were published for pool " + pool_name)
generation = items[0]["spec"]["pool"]["generation"]
print(f"{len(items)} ResourceSlices in pool {pool_name}, generation {generation}")
for s in items:
    spec = s["spec"]
    print(f"slice {s['metadata']['name']}:")
    for c in spec.get("sharedCounters", []):
        capacity = c["counters"]["capacity"]["value"]
        print(f"  counter set {c['name']}: capacity {capacity}")
    for d in spec.get("devices", []):
        a = d.get("attributes", {})
        ident = a.get("resource.kubernetes.io/pciBusID", a.get("mdevUUID", {})).get("string", "")
        uses = ", ".join(u["counterSet"] + " " + u["counters"]["capacity"]["value"]
                         for u in d.get("consumesCounters", []))
        kind = a["type"]["string"]
        print(f"  {d['name']:<44} {kind:<5} {ident:<37} {('uses ' + uses) if uses else ''}")
