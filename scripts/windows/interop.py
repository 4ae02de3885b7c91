#!/usr/bin/env python3
"""A Windows longhaul (under Wine) with a Linux one, as real processes on
loopback: bytes compared end to end each way, SOCKS5 with curl, a wrong pin
refused, a UDP forward, and the folder carrier between a Windows process and
a Linux process on one folder (seed 000's host and VM), and the control
channel on a named pipe (status, reload, a taken pipe refused).

Usage: interop.py LINUX_LONGHAUL WINDOWS_LONGHAUL_EXE
Needs WINEPREFIX set (scripts/windows/wine_prefix.sh). Every process it
starts is stopped by PID; nothing listens beyond 127.0.0.1.
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

LINUX, WINDOWS = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
TOKEN = "interop-" + os.urandom(8).hex()
started = []
failures = []


def free_port(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(args, windows=False, log=None):
    cmd = (["wine", WINDOWS] if windows else [LINUX]) + args
    env = dict(os.environ, LONGHAUL_TOKEN=TOKEN, WINEDEBUG="-all")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    started.append(p)
    return p


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def echo_server():
    """A TCP echo target on Linux; returns its port."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)

    def serve(c):
        with c:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                c.sendall(b)

    def run():
        while True:
            c, _ = ls.accept()
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    return ls.getsockname()[1]


def udp_echo():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))

    def run():
        while True:
            b, a = s.recvfrom(65536)
            s.sendto(b, a)

    threading.Thread(target=run, daemon=True).start()
    return s.getsockname()[1]


class Relay:
    """A TCP relay in front of a server that can drop every connection it
    holds at once with a reset (a dropped carrier)."""

    def __init__(self, to_port):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.to_port = to_port
        self.held = []
        self.lock = threading.Lock()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while True:
            a, _ = self.ls.accept()
            try:
                b = socket.create_connection(("127.0.0.1", self.to_port), 10)
            except OSError:
                a.close()
                continue
            with self.lock:
                self.held += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self.pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def pipe(x, y):
        try:
            while True:
                d = x.recv(65536)
                if not d:
                    y.shutdown(socket.SHUT_WR)
                    return
                y.sendall(d)
        except OSError:
            return

    def reset(self):
        import struct
        with self.lock:
            held, self.held = self.held, []
        for c in held:
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.close()
            except OSError:
                pass
        return len(held)


def wine_run(args, cmd=None, cwd=None):
    """longhaul.exe ARGS (or CMD) under Wine to its end; stdout and stderr
    as text. Through files, not pipes: a Wine system process the command
    starts (services.exe, wineboot) inherits them and would hold a pipe
    open long after the command ended."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.run(cmd or (["wine", WINDOWS] + args), stdout=out, stderr=err, cwd=cwd,
                           timeout=90, env=dict(os.environ, LONGHAUL_TOKEN=TOKEN, WINEDEBUG="-all"))
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(p.args, p.returncode,
                                           out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


def wait_port(port, secs=60):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def echo_through(port, size=8 << 20, midway=None):
    """Sends `size` random bytes to an echo behind `port` and compares;
    `midway()` runs once half of them are sent."""
    data = os.urandom(size)
    got = bytearray()
    with socket.create_connection(("127.0.0.1", port), 30) as s:
        s.settimeout(60)

        def send():
            half = size // 2
            s.sendall(data[:half])
            if midway:
                time.sleep(0.2)
                midway()
            s.sendall(data[half:])
            s.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=send)
        t.start()
        while True:
            b = s.recv(1 << 20)
            if not b:
                break
            got += b
        t.join()
    return hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


def udp_echoed(port, payload):
    """What comes back for `payload` sent to a UDP forward (up to 10 tries)."""
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(2)
    for _ in range(10):
        u.sendto(payload, ("127.0.0.1", port))
        try:
            return u.recvfrom(100)[0]
        except OSError:
            pass
    return None


def winpath(p):
    """A Linux path as Wine's Z: drive spells it."""
    return "Z:" + p.replace("/", "\\")


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail), flush=True)
    if not ok:
        failures.append(name)


def main():
    # A persistent wineserver (killed at the end): one that exits after its
    # last process races the next Wine process started, which then fails
    # with "wine client error:0: recvmsg: Connection reset by peer".
    # (Under test.sh one is running already, and this does nothing.)
    subprocess.run(["wineserver", "-p"], capture_output=True)
    work = tempfile.mkdtemp(prefix="lh-interop-")
    logs = {}

    def log(name):
        logs[name] = open(os.path.join(work, name + ".log"), "w+")
        return logs[name]

    def text(name):
        logs[name].flush()
        with open(os.path.join(work, name + ".log")) as f:
            return f.read()

    try:
        subprocess.run([LINUX, "keygen", "--out", os.path.join(work, "server.key")],
                       check=True, capture_output=True)
        pin = subprocess.run([LINUX, "fingerprint", os.path.join(work, "server.key")],
                             check=True, capture_output=True, text=True).stdout.strip()
        target, udp_target = echo_server(), udp_echo()
        allow = ["--allow", f"127.0.0.1:{target}", "--allow", f"udp:127.0.0.1:{udp_target}"]

        # A Windows client with a Linux server.
        sport = free_port()
        srv = start(["server", "--listen", f"127.0.0.1:{sport}", "--key",
                     os.path.join(work, "server.key")] + allow, log=log("linux-server"))
        wait_port(sport)
        lport, socks, uport = free_port(), free_port(), free_port(socket.SOCK_DGRAM)
        cli = start(["client", f"127.0.0.1:{sport}", "--pin", pin,
                     "-L", f"{lport}:127.0.0.1:{target}",
                     "-L", f"udp:{uport}:127.0.0.1:{udp_target}",
                     "-D", str(socks)], windows=True, log=log("windows-client"))
        up = wait_port(lport, 90)
        check("windows client: -L up", up, text("windows-client")[-2000:])
        if up:
            check("windows client: -L bytes compared", echo_through(lport))
            r = subprocess.run(["curl", "-s", "--http0.9", "--max-time", "30", "--socks5-hostname",
                                f"127.0.0.1:{socks}", f"http://127.0.0.1:{target}/x"],
                               capture_output=True)
            # The echo target sends the request back: curl sees its own GET.
            check("windows client: SOCKS5 with curl", b"GET /x" in r.stdout, repr(r.stdout[:200]))
            got = udp_echoed(uport, b"ping-udp")
            check("windows client: UDP forward", got == b"ping-udp", repr(got))
        stop(cli)

        # Resume: the carrier between the Windows client and the server is
        # reset in the middle of a transfer; nothing is lost or doubled.
        relay = Relay(sport)
        lport = free_port()
        cli = start(["client", f"127.0.0.1:{relay.port}", "--pin", pin,
                     "-L", f"{lport}:127.0.0.1:{target}"], windows=True, log=log("resume-client"))
        if wait_port(lport, 90):
            resets = []
            ok = echo_through(lport, 16 << 20, midway=lambda: resets.append(relay.reset()))
            check("windows client: resume across a carrier reset, bytes compared",
                  ok and resets and resets[0] > 0 and "resumed" in text("resume-client"),
                  f"ok={ok} resets={resets} " + text("resume-client")[-1500:])
        else:
            check("windows client: resume (-L up)", False, text("resume-client")[-2000:])
        stop(cli)
        wrong = "SHA256:" + "A" * 43
        r = wine_run(["client", f"127.0.0.1:{sport}", "--pin", wrong,
                      "-L", f"{free_port()}:127.0.0.1:{target}"])
        check("windows client: a wrong pin is refused",
              r.returncode != 0 and "pin" in (r.stdout + r.stderr).lower(),
              (r.stdout + r.stderr)[-500:])
        stop(srv)

        # quic://: a Windows client with a Linux server over QUIC (quinn
        # on Windows' UDP sockets): TCP bytes and UDP datagrams.
        qport = free_port(socket.SOCK_DGRAM)
        qsrv = start(["server", "--listen", f"quic://127.0.0.1:{qport}", "--key",
                      os.path.join(work, "server.key")] + allow, log=log("linux-quic-server"))
        time.sleep(1)
        lport, uport = free_port(), free_port(socket.SOCK_DGRAM)
        cli = start(["client", f"quic://127.0.0.1:{qport}", "--pin", pin,
                     "-L", f"{lport}:127.0.0.1:{target}",
                     "-L", f"udp:{uport}:127.0.0.1:{udp_target}"],
                    windows=True, log=log("windows-quic-client"))
        up = wait_port(lport, 90)
        # Wine 8 has no IP_RECVECN, which quinn-udp 0.5 (quinn 0.11's)
        # sets on every Windows UDP socket (quinn-udp 0.6 makes it
        # optional): said, not failed, until the stack moves on.
        wine_lacks_ecn = not up and "10045" in text("windows-quic-client")
        if wine_lacks_ecn:
            print("note: quic:// not checked under Wine: it lacks IP_RECVECN, which quinn-udp 0.5 "
                  "needs (WSAEOPNOTSUPP, 10045); Windows 10 and later have it")
        else:
            check("windows client over quic://: -L up", up, text("windows-quic-client")[-2000:])
        if up:
            check("windows client over quic://: -L bytes compared", echo_through(lport))
            got = udp_echoed(uport, b"ping-quic")
            check("windows client over quic://: UDP forward", got == b"ping-quic", repr(got))
        stop(cli)
        stop(qsrv)

        # A Linux client with a Windows server.
        sport = free_port()
        wsrv = start(["server", "--listen", f"127.0.0.1:{sport}", "--key",
                      os.path.join(work, "server.key")] + allow,
                     windows=True, log=log("windows-server"))
        up = wait_port(sport, 90)
        check("windows server: listening", up, text("windows-server")[-2000:])
        lport = free_port()
        cli = start(["client", f"127.0.0.1:{sport}", "--pin", pin,
                     "-L", f"{lport}:127.0.0.1:{target}"], log=log("linux-client"))
        if up and wait_port(lport, 60):
            check("windows server: -L bytes compared", echo_through(lport))
        else:
            check("windows server: -L up", False, text("linux-client")[-2000:])
        # The control channel (a named pipe): status lists the session,
        # reload answers; a second server cannot take the same pipe.
        status = wine_run(["status", "--json"])
        try:
            mine = [v for v in json.loads(status.stdout) if v.get("pid") and v["role"] == "server"]
        except ValueError:
            mine = []
        check("windows server: status through its pipe shows the session",
              any(v["sessions_total"] == 1 for v in mine), status.stdout[-800:] + status.stderr[-500:])
        r = wine_run(["reload"])
        check("windows server: longhaul reload through its pipe",
              r.returncode == 0 and "reloaded rules" in r.stdout, r.stdout[-500:] + r.stderr[-500:])
        pipe = r"\\.\pipe\longhaul-interop-" + os.urandom(4).hex()
        p1 = start(["server", "--listen", f"127.0.0.1:{free_port()}", "--key",
                    os.path.join(work, "server.key"), "--control", pipe] + allow,
                   windows=True, log=log("pipe-first"))
        time.sleep(5)
        p2 = start(["server", "--listen", f"127.0.0.1:{free_port()}", "--key",
                    os.path.join(work, "server.key"), "--control", pipe] + allow,
                   windows=True, log=log("pipe-second"))
        time.sleep(5)
        r = wine_run(["status", pipe])
        check("windows server: status of a named pipe", "server pid" in r.stdout,
              r.stdout[-500:] + r.stderr[-500:])
        # Windows refuses a first instance of a pipe that exists
        # (FILE_FLAG_FIRST_PIPE_INSTANCE); Wine 8 does not, so this is said,
        # not checked.
        if "in use by another process" not in text("pipe-second"):
            print("note: Wine let a second server create the same pipe "
                  "(it ignores FILE_FLAG_FIRST_PIPE_INSTANCE; Windows refuses it)")
        stop(p1)
        stop(p2)
        stop(cli)
        stop(wsrv)

        # A Windows service (Wine's service manager): installed from a
        # config file, started, carries bytes, reloads, drains on stop and
        # is removed. Wine starts installed services at each of its boots:
        # it is removed in any case.
        name = "longhaul-interop-" + os.urandom(3).hex()
        svc_port = free_port()
        # What a service (LocalSystem) reads must be changeable by no one
        # else: a folder of its own in C:\ (this machine's /tmp is
        # everyone's to write, and Wine says so).
        svc_dir = os.path.join(os.environ["WINEPREFIX"], "drive_c", name)
        os.mkdir(svc_dir, 0o755)
        shutil.copy(os.path.join(work, "server.key"), svc_dir)
        # Installed from there too, as from C:\\Program Files\\longhaul: the
        # build's own folder may be one everyone can write (a clone in /tmp).
        svc_exe = os.path.join(svc_dir, "longhaul.exe")
        shutil.copy(WINDOWS, svc_exe)

        def svc_run(args, cwd=None):
            return wine_run(args, cmd=["wine", svc_exe] + args, cwd=cwd)

        cfg = os.path.join(svc_dir, "service.toml")
        with open(cfg, "w") as f:
            f.write(f'listen = ["127.0.0.1:{svc_port}"]\nkey = "server.key"\n'
                    f'token = "{TOKEN}"\nallow = ["127.0.0.1:{target}"]\n')
        installed = False
        # Wine ends its service processes with its server once no other
        # program runs: one runs meanwhile.
        keep = start(["bench", "server", "--listen", f"127.0.0.1:{free_port()}"], windows=True)
        try:
            r = svc_run(["service", "install", "--name", name, "server", "--config",
                          "Z:" + cfg.replace("/", "\\")], cwd=work)
            check("windows service: a folder everyone may write is refused",
                  r.returncode != 0 and "can be replaced by Everyone" in r.stderr,
                  r.stdout + r.stderr)
            os.chmod(cfg, 0o666)
            r = svc_run(["service", "install", "--name", name,
                          "server", "--config", "service.toml"], cwd=svc_dir)
            check("windows service: a config file everyone may change is refused",
                  r.returncode != 0 and "service.toml can be changed by Everyone" in r.stderr,
                  r.stdout + r.stderr)
            os.chmod(cfg, 0o644)
            # A file the config names (not the command line) is checked too.
            ak = os.path.join(work, "open_ak")
            with open(ak, "w") as f:
                f.write("")
            os.chmod(ak, 0o666)
            cfg2 = os.path.join(svc_dir, "service2.toml")
            with open(cfg, "r") as f, open(cfg2, "w") as g:
                g.write(f.read() + f'authorized-keys = "{winpath(ak).replace(chr(92), chr(92) * 2)}"\n')
            r = svc_run(["service", "install", "--name", name,
                          "server", "--config", "service2.toml"], cwd=svc_dir)
            check("windows service: a file its config names, others may change, is refused",
                  r.returncode != 0 and "open_ak can be changed by Everyone" in r.stderr,
                  r.stdout + r.stderr)
            os.remove(cfg2)
            # The words of a cmd:// command; a drive-relative path.
            bat = os.path.join(svc_dir, "open.bat")
            with open(bat, "w") as f:
                f.write("@echo off\r\n")
            os.chmod(bat, 0o666)
            r = svc_run(["service", "install", "--name", name, "client",
                          "cmd://" + winpath(bat), "-L", "1:127.0.0.1:1"], cwd=svc_dir)
            check("windows service: a cmd:// program others may change is refused",
                  r.returncode != 0 and "open.bat can be changed by Everyone" in r.stderr,
                  r.stdout + r.stderr)
            for cmd, said in (("cmd://%ProgramData%\\lh\\plink.exe host", "one plain command"),
                              ("cmd://" + winpath(svc_exe) + " x&C:\\x.bat", "one plain command"),
                              ("cmd://" + winpath(svc_exe) + " -FC:\\cfg", "a word of its own"),
                              ("cmd://plink host", "whole path")):
                r = svc_run(["service", "install", "--name", name, "client", cmd,
                              "-L", "1:127.0.0.1:1"], cwd=svc_dir)
                check(f"windows service: '{cmd}' is refused",
                      r.returncode != 0 and said in r.stderr, r.stdout + r.stderr)
            r = svc_run(["service", "install", "--name", name,
                          "server", "--config", "service.toml", "--authorized-keys", "C:keys"],
                         cwd=svc_dir)
            check("windows service: a drive-relative path is refused",
                  r.returncode != 0 and "drive-relative" in r.stderr, r.stdout + r.stderr)
            r = svc_run(["service", "install", "--name", "..\\x",
                          "server", "--config", "service.toml"], cwd=svc_dir)
            check("windows service: a name that is a path is refused",
                  r.returncode != 0 and "a service name is" in r.stderr, r.stdout + r.stderr)
            r = svc_run(["service", "install", "--name", name,
                          "server", "--config", "service.toml"], cwd=svc_dir)
            installed = r.returncode == 0
            check("windows service: installed", installed and "sc.exe start" in r.stdout,
                  r.stdout + r.stderr)
            wine_run([], cmd=["wine", "sc", "start", name])
            up = wait_port(svc_port, 60)
            check("windows service: started, listening", up)
            if up:
                lport = free_port()
                cli = start(["client", f"127.0.0.1:{svc_port}", "--pin", pin,
                             "-L", f"{lport}:127.0.0.1:{target}"], log=log("service-client"))
                check("windows service: -L bytes compared",
                      wait_port(lport, 60) and echo_through(lport, 1 << 20))
                stop(cli)
                r = wine_run(["service", "reload", "--name", name])
                check("windows service: reload asked", r.returncode == 0, r.stdout + r.stderr)
        finally:
            if installed:
                r = wine_run(["service", "uninstall", "--name", name])
                check("windows service: stopped and uninstalled",
                      r.returncode == 0 and "uninstalled" in r.stdout, r.stdout + r.stderr)
        stop(keep)
        shutil.rmtree(svc_dir, ignore_errors=True)
        logs_dir = os.path.join(os.environ["WINEPREFIX"], "drive_c", "users", "Public",
                                "longhaul", "logs")
        svc_log = ""
        for f in sorted(os.listdir(logs_dir)) if os.path.isdir(logs_dir) else []:
            if f.startswith(name):
                with open(os.path.join(logs_dir, f)) as fh:
                    svc_log += fh.read()
        check("windows service: its log file has the reload and the stop",
              "reloaded rules" in svc_log and f"service '{name}' stopped" in svc_log, svc_log[-1500:])

        # The folder carrier: a Linux server and a Windows client on one
        # folder (Wine sees this machine's / as Z:).
        folder = os.path.join(work, "share")
        os.mkdir(folder)
        fsrv = start(["server", "--listen", f"dir://{folder}", "--key",
                      os.path.join(work, "server.key")] + allow, log=log("folder-server"))
        time.sleep(2)
        lport = free_port()
        winfolder = "/Z:" + folder
        fcli = start(["client", f"dir://{winfolder}", "--pin", pin,
                      "-L", f"{lport}:127.0.0.1:{target}"], windows=True, log=log("folder-client"))
        up = wait_port(lport, 90)
        check("folder carrier (Windows client, Linux server): -L up", up,
              text("folder-client")[-2000:] + text("folder-server")[-1000:])
        if up:
            check("folder carrier (Windows client, Linux server): bytes compared",
                  echo_through(lport, 4 << 20))
            # Wine gives ReadDirectoryChangesW on its Z: drive (from
            # inotify): the Windows side is woken, not polling.
            check("folder carrier (Windows client): woken by file-change notifications",
                  "polls" not in text("folder-client")
                  and "polling instead" not in text("folder-client"), text("folder-client")[-1500:])
        stop(fcli)
        stop(fsrv)

        # cp, both ways, with a Linux and a Windows server; every spelling
        # that would leave the served folder or name something else on
        # Windows refused by the Windows server.
        blob = os.path.join(work, "blob.bin")
        with open(blob, "wb") as f:
            f.write(os.urandom(3 << 20))
        with open(blob, "rb") as f:
            blob_hash = hashlib.sha256(f.read()).digest()

        def same(path):
            try:
                with open(path, "rb") as f:
                    return hashlib.sha256(f.read()).digest() == blob_hash
            except OSError:
                return False

        cp_token = ["--insecure", "--token", TOKEN]
        served = os.path.join(work, "served")
        os.mkdir(served)
        cport = free_port()
        lsrv = start(["server", "--listen", f"tcp://127.0.0.1:{cport}", "--files", served,
                      "--files-for-token", "rw"] + cp_token, log=log("cp-linux-server"))
        wait_port(cport)
        url = f"tcp://127.0.0.1:{cport}"
        r = wine_run(["cp"] + cp_token + [winpath(blob), f"{url}:/sub-up.bin"])
        check("cp (Windows client, Linux server): upload, bytes compared",
              r.returncode == 0 and same(os.path.join(served, "sub-up.bin")), r.stdout + r.stderr)
        r = wine_run(["cp"] + cp_token + [f"{url}:/sub-up.bin", winpath(os.path.join(work, "down.bin"))])
        check("cp (Windows client, Linux server): download, bytes compared",
              r.returncode == 0 and same(os.path.join(work, "down.bin")), r.stdout + r.stderr)
        stop(lsrv)

        wserved = os.path.join(work, "wserved")
        os.makedirs(os.path.join(wserved, "sub"))
        wport = free_port()
        wsrv = start(["server", "--listen", f"tcp://127.0.0.1:{wport}", "--files", winpath(wserved),
                      "--files-for-token", "rw"] + cp_token, windows=True, log=log("cp-windows-server"))
        if wait_port(wport, 90):
            url = f"tcp://127.0.0.1:{wport}"

            def linux_cp(*args):
                return subprocess.run([LINUX, "cp"] + cp_token + list(args),
                                      capture_output=True, text=True, timeout=90)

            r = linux_cp(blob, f"{url}:/sub/up.bin")
            check("cp (Linux client, Windows server): upload, bytes compared",
                  r.returncode == 0 and same(os.path.join(wserved, "sub", "up.bin"))
                  and not os.path.exists(os.path.join(wserved, "sub", ".longhaul-partial")),
                  r.stdout + r.stderr)
            r = linux_cp(f"{url}:/sub/up.bin", os.path.join(work, "down2.bin"))
            check("cp (Linux client, Windows server): download, bytes compared",
                  r.returncode == 0 and same(os.path.join(work, "down2.bin")), r.stdout + r.stderr)
            r = linux_cp("-r", f"{url}:/sub", os.path.join(work, "tree"))
            check("cp (Linux client, Windows server): a folder with -r",
                  r.returncode == 0 and same(os.path.join(work, "tree", "up.bin")), r.stdout + r.stderr)
            escapes = ["../x", "sub/../../x", "/C:/windows/x", "C:x", "sub\\..\\..\\x",
                       "up.bin:stream", "CON", "nul.txt", "COM1.log", "trailing.", "trailing ",
                       "PROGRA~1", "SUB~1/x", ".LONGHAUL-PARTIAL/x", "$MFT", "$Extend/x", "\\\\?\\C:\\x"]
            for e in escapes:
                up = linux_cp(blob, f"{url}:/{e}")
                down = linux_cp(f"{url}:/{e}", os.path.join(work, "escaped.bin"))
                check(f"cp (Windows server): '{e}' refused both ways",
                      up.returncode != 0 and down.returncode != 0
                      and not os.path.exists(os.path.join(work, "escaped.bin")),
                      up.stderr[-300:] + down.stderr[-300:])
            left = [n for n in os.listdir(wserved) if n != "sub"]
            check("cp (Windows server): nothing made by the refused requests",
                  not left, str(left))
            check("cp (Windows server): refusals logged",
                  "refused in names" in text("cp-windows-server")
                  and "device names" in text("cp-windows-server"), text("cp-windows-server")[-1500:])
        else:
            check("cp (Windows server): listening", False, text("cp-windows-server")[-2000:])
        stop(wsrv)
    finally:
        for p in started:
            stop(p)
        subprocess.run(["wineserver", "-k"], capture_output=True)
        if failures:
            for name, f in logs.items():
                f.flush()
                print(f"--- {name} log (end) ---")
                print(text(name)[-3000:])
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print(f"{len(failures)} interop check(s) failed: {', '.join(failures)}")
        sys.exit(1)
    print("all interop checks passed")


if __name__ == "__main__":
    main()
