"""Reads a deferred mode's Chrome trace (deferred_trace.py): GPU kernels grouped into target / draft runs; the time from each
verify's last kernel to the next proposal's first, and what runs between (usage: trace_gaps.py FILE.trace.json.gz)."""
import json,gzip,collections,sys
t=json.load(gzip.open(sys.argv[1]))
ev=[e for e in t['traceEvents'] if e.get('ph')=='X']
gpu=sorted([e for e in ev if e.get('cat') in ('kernel','gpu_memcpy','gpu_memset')],key=lambda e:e['ts'])
# cpu annotations (record_function) 
ann=sorted([e for e in ev if e.get('cat') in ('user_annotation','gpu_user_annotation')],key=lambda e:e['ts'])
print(collections.Counter(e['name'] for e in ann).most_common(15))
def key(n):
    if n.startswith(('_decode','_dense_argmax','_flash')): return 'DRAFT'
    if n.startswith(('_w4a16','_layer','nvjet','triton')): return 'TARGET'
    return n[:40]
rows=[];last=None;prev_end=None
for e in gpu:
    k=key(e['name']); gap=e['ts']-prev_end if prev_end else 0
    if k!=last or gap>30:
        if last: rows.append([last,cnt,acc,start,prev_end,gapb])
        last=k;cnt=0;acc=0;start=e['ts'];gapb=gap
    cnt+=1;acc+=e['dur'];prev_end=max(prev_end or 0,e['ts']+e['dur'])
rows.append([last,cnt,acc,start,prev_end,gapb])
di=[i for i,r in enumerate(rows) if r[0]=='DRAFT']
mid=di[len(di)//2]
t0=rows[mid-12][3]
for r in rows[mid-12:mid+14]: print('%-42s x%4d sum %8.1f  [%9.1f, %9.1f] span %7.1f gap-before %.1f'%(r[0],r[1],r[2],r[3]-t0,r[4]-t0,r[4]-r[3],r[5]))
dr=[r for r in rows if r[0]=='DRAFT']
import statistics
sp=[r[4]-r[3] for r in dr]; n=[r[1] for r in dr]
print('draft blocks', len(dr), 'mean span %.1f us, median %.1f'%(statistics.mean(sp), statistics.median(sp)), collections.Counter(n).most_common(8))
import statistics as st
pre=[];post=[]
for i,r in enumerate(rows):
    if r[0]!='DRAFT' or r[1]<600: continue
    j=i-1
    while j>=0 and not (rows[j][0]=='TARGET' and rows[j][1]>=600): j-=1
    if j<0: continue
    pre.append((r[3]-rows[j][4], i-j-1))
    k=i+1
    while k<len(rows) and not (rows[k][0]=='TARGET' and rows[k][1]>=600): k+=1
    if k<len(rows): post.append((rows[k][3]-r[4], k-i-1))
print('verify end -> draft start: median %.1f us, mean %.1f'%(st.median([p[0] for p in pre]), st.mean([p[0] for p in pre])), 'rows between', collections.Counter(p[1] for p in pre))
print('draft end -> verify start: median %.1f us, mean %.1f'%(st.median([p[0] for p in post]), st.mean([p[0] for p in post])))
big=[r for r in rows if r[0]=='TARGET' and r[1]>=600]
print('verify kernel span median %.1f'%st.median([r[4]-r[3] for r in big]), len(big))
cnt=0
for i,r in enumerate(rows):
    if r[0]=='DRAFT' and r[1]>=600:
        j=i-1
        while not (rows[j][0]=='TARGET' and rows[j][1]>=600): j-=1
        if i-j-1 in (19,20):
            cnt+=1
            if cnt==3:
                t0=rows[j][4]
                for rr in rows[j+1:i+1]: print('   %-42s x%3d sum %7.1f at %8.1f gap %.1f'%(rr[0],rr[1],rr[2],rr[3]-t0,rr[5]))
                break
