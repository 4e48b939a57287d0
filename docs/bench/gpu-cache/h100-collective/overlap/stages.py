import collections,statistics,sys,re
d=collections.defaultdict(list)
pat=re.compile(r'^(\S+) dckpt-profile (\d+) v(\d+) (\S+) ([0-9.]+)$')
for l in open(sys.argv[1]):
    m=pat.match(l.strip())
    if not m: continue
    tag,pid,v,stage,val=m.groups()
    if int(v)<2: continue
    d[(tag,stage)].append(float(val))
tags=sorted({k[0] for k in d})
for t in tags:
    print("==",t)
    for (tt,st),v in sorted(d.items()):
        if tt==t: print(f"  {st:18s} n={len(v):3d} median {statistics.median(v):8.3f}  max {max(v):8.3f}")
