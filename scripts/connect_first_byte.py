#!/usr/bin/env python3
# Connect to first byte through a tcp:// and a tls:// -L forward, before and
# after a change, interleaved (3 rounds, 500 connections each after 100 of
# warm-up): /work/longhaul-before and /work/longhaul-after (release builds),
# a key at /tmp/bb/s.key (scripts/before_after.sh makes it).
import socket, subprocess, threading, time, statistics, sys, os
def echo():
    ls=socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR,1); ls.bind(("127.0.0.1",35501)); ls.listen(512)
    def h(c):
        try:
            while True:
                d=c.recv(65536)
                if not d: break
                c.sendall(d)
        except OSError: pass
        c.close()
    while True:
        c,_=ls.accept(); threading.Thread(target=h,args=(c,),daemon=True).start()
threading.Thread(target=echo,daemon=True).start()
def run(binary, scheme):
    srv=subprocess.Popen([binary,"server","--listen",f"{scheme}://127.0.0.1:35502","--key","/tmp/bb/s.key","--allow","127.0.0.1:35501","--insecure","--control","none"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    extra=["--insecure"] if scheme=="tcp" else ["--pin",open("/tmp/bb/s.key.pub").read().split()[0]]
    cli=subprocess.Popen([binary,"client",f"{scheme}://127.0.0.1:35502",*extra,"-L","35503:127.0.0.1:35501","--control","none"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    time.sleep(0.8)
    ts=[]
    for i in range(600):
        t=time.perf_counter(); s=socket.create_connection(("127.0.0.1",35503)); s.sendall(b"x"); s.recv(1); ts.append(time.perf_counter()-t); s.close()
    cli.terminate(); srv.terminate(); cli.wait(); srv.wait()
    ts=sorted(ts[100:])
    return ts[len(ts)//2]*1e3, ts[int(len(ts)*.9)]*1e3
for r in range(3):
    for w in ["before","after"]:
        for sch in ["tcp","tls"]:
            p50,p90=run(f"/work/longhaul-{w}",sch)
            print(f"{w} {sch} p50 {p50:.3f} ms p90 {p90:.3f} ms",flush=True)
