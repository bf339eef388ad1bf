import re, sys
from collections import Counter
s = open("/work/main/devtmp/w4cu/all.sass").read()
for fn in re.findall(r"\.text\.(\S+):", s):
    body = s.split(".text." + fn + ":")[1].split(".text.")[0]
    lines = body.splitlines()
    labels = {}
    for i, l in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", l)
        if m: labels[m.group(1)] = i
    best = None
    for i, l in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", l)
        if m and labels.get(m.group(1), 1e9) < i:
            seg = lines[labels[m.group(1)]:i+1]
            ops = Counter(re.findall(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", "\n".join(seg)))
            if best is None or ops["HMMA"] > best["HMMA"]: best = ops
    n = sum(best.values()); h = best["HMMA"]
    print(fn[9:20], "loop", n, "HMMA", h, "per 2048 weights %.0f" % (n / (h * 256) * 2048), best.most_common(10))
