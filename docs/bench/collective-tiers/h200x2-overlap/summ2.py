import json,sys,statistics
rows=[]
for line in open(sys.argv[1]):
    tag, _, js = line.partition(' ')
    try: d=json.loads(js)
    except Exception as e: print(tag, "bad", e); continue
    print("==", tag)
    for m in d["modes"]:
        v=m["version_seconds"]
        print(f"  {m['mode']:10s} ov={str(m.get('overlapped')):5s} total {m['seconds']:.3f} s  v1 {1e3*v[0]:7.1f} ms  incr median {1e3*statistics.median(v[1:]):7.1f} ms  reduce {m['reduce_seconds']*1e3:6.1f} ms  stored {m['total_stored_bytes']/2**20:8.0f} MiB  drain {m.get('drain_seconds',0):.2f} s")
    ms={}
    for m in d["modes"]: ms.setdefault(m["mode"],m)
    if "collective" in ms and "local" in ms:
        c,l=ms["collective"],ms["local"]
        line=f"  collective/local run {c['seconds']/l['seconds']:.2f} incr {statistics.median(c['version_seconds'][1:])/statistics.median(l['version_seconds'][1:]):.2f}"
        if "full" in ms: line+=f"  collective/full {c['seconds']/ms['full']['seconds']:.2f}"
        print(line)
