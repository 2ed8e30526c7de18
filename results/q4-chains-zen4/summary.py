import json, glob, statistics, sys
d = {}
for f in glob.glob(sys.argv[1] + '/prof-*.json'):
    try:
        j = json.load(open(f))
    except ValueError:
        continue
    v = f.split('/')[-1].split('-')[1]
    d.setdefault(v, []).append(j['t_ms'])
for v, runs in sorted(d.items()):
    ks = sorted(runs[0], key=int)
    print(v, len(runs), ' '.join(f"t{k}={statistics.mean(r[k] for r in runs):.1f}(min {min(r[k] for r in runs):.1f})" for k in ks))
