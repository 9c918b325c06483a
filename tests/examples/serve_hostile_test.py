"""examples/serve under hostile clients: bodies built to break a parser,
truncated and garbled requests, HTTP/1.0, thousands of clients that leave
mid-stream, slowloris, overload, a KV cache too small for the batch, and
signals at every stage of a server's life. After each scenario keel-serve
still answers /health at once and every KV page is free once nothing runs
(or, for a server that was signalled, it exits with the status promised).

  serve_hostile_test.py KEEL_SERVE WORK_DIR

WORK_DIR holds model/, the small random Llama of make_test_model.py (the
fixture examples.serve_test_model writes it). Requests set ignore_eos, so
each generates exactly its max_tokens.
"""

import atexit
import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

serve, work = sys.argv[1:3]
os.chdir(work)
assert os.path.exists("model/config.json"), f"{work}/model is missing: make_test_model.py writes it"

PROMPT = "The GNU General Public License is "
READ_TIMEOUT = 2  # the shared server's --read-timeout
rng = random.Random(0)


class TimedOut(AssertionError):
    pass


# --- the server ------------------------------------------------------------

class Server:
    """One keel-serve process on a port of its own; its output goes to NAME.log."""

    def __init__(self, name, *args, listen=True):
        self.name, self.log = name, f"{name}.log"
        port_file = f"port-{name}"
        for f in (port_file, port_file + ".tmp"):
            if os.path.exists(f):
                os.remove(f)
        self.port_file = port_file
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [serve, "--model", "model", "--model-name", "test-llama", "--port-file", port_file,
                 *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # A failed assertion must not leave the server running: it would
        # hold ctest's output pipe open until the test's timeout.
        atexit.register(self.proc.kill)
        self.port = None
        if listen:
            self.wait_listening()

    def wait_listening(self):
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, \
                f"{self.name}: keel-serve exited {self.proc.returncode} before it listened"
            assert time.monotonic() < deadline, \
                f"{self.name}: keel-serve did not listen within 60 s"
            try:
                with open(self.port_file) as f:
                    self.port = int(f.read())
                return
            except (OSError, ValueError):
                time.sleep(0.02)

    def get(self, path, timeout=10.0):
        return exchange(self.port, request("GET", path), timeout, f"{self.name} GET {path}")

    def stats(self):
        r = self.get("/keel/stats")
        assert r.status == 200, f"{self.name}: /keel/stats answered {r.status}"
        return r.json()

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        """The exit status, or AssertionError (and SIGKILL) if none within timeout."""
        try:
            return self.proc.wait(timeout=max(timeout, 0.01))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise TimedOut(f"{self.name}: keel-serve did not exit within {timeout:.1f} s")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.send_signal(sig)
        return self.wait(timeout)

    def tail(self):
        try:
            with open(self.log, "rb") as f:
                return f.read()[-3000:].decode("utf-8", "replace")
        except OSError:
            return ""


SERVERS = []


def start(name, *args):
    s = Server(name, *args)
    SERVERS.append(s)
    return s


def stop_clean(server, scenario):
    """SIGTERM with nothing running: exit status 0 (every page free)."""
    code = server.stop()
    assert code == 0, f"{scenario}: keel-serve exited {code} on SIGTERM (pages not all free?)"


def assert_alive_and_pages_free(server, scenario):
    """/health answers 200 within 1 s; once nothing runs, every page is free."""
    t = time.monotonic()
    r = exchange(server.port, request("GET", "/health"), 1.0, f"{scenario}: /health")
    took = time.monotonic() - t
    assert r.status == 200 and r.json().get("status") == "ok", \
        f"{scenario}: /health answered {r.status} {r.body[:200]!r}"
    assert took < 1.0, f"{scenario}: /health took {took:.2f} s"
    deadline = time.monotonic() + 20
    while True:
        s = server.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            break
        assert time.monotonic() < deadline, f"{scenario}: requests still running after 20 s: {s}"
        time.sleep(0.02)
    assert s["pages_free"] == s["pages_total"], f"{scenario}: pages lost: {s}"
    assert s["failed_steps"] == 0, f"{scenario}: failed steps: {s}"
    return s


# --- raw HTTP over sockets -------------------------------------------------

def request(method, path, body=b"", content_type="application/json", version="1.1",
            headers=()):
    lines = [f"{method} {path} HTTP/{version}", "Host: 127.0.0.1"]
    if method == "POST":
        if content_type is not None:
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(body)}")
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def completion_body(prompt=PROMPT, **fields):
    fields.setdefault("ignore_eos", True)
    return json.dumps({"model": "test-llama", "prompt": prompt, **fields}).encode()


class Head:
    def __init__(self, raw):
        lines = raw.decode("latin-1").split("\r\n")
        self.status_line = lines[0]
        parts = self.status_line.split(" ", 2)
        assert len(parts) >= 2 and parts[0].startswith("HTTP/"), f"bad status line {lines[0]!r}"
        self.version, self.status = parts[0], int(parts[1])
        self.headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                k = k.strip().lower()
                self.headers[k] = (self.headers[k] + ", " if k in self.headers else "") + v.strip()


class Reply:
    def __init__(self, head, body, complete, elapsed):
        self.head, self.body, self.complete, self.elapsed = head, body, complete, elapsed
        self.status, self.headers = head.status, head.headers

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise AssertionError(f"reply {self.status} is not JSON: {self.body[:300]!r}")


class Conn:
    """A client socket with a read buffer; every read is bounded by a deadline."""

    def __init__(self, port, timeout=10.0):
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.eof = self.reset = False

    def send(self, data, tolerant=False):
        """False if the server closed (or stopped reading) first and tolerant is set."""
        try:
            self.sock.settimeout(self.timeout)  # reads leave a shorter one behind
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            if tolerant:
                return False
            raise

    def fill(self, deadline):
        """Reads more; False at end of stream (or reset). TimedOut past the deadline."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimedOut("no data before the deadline")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            self.reset, chunk = True, b""
        except TimeoutError:
            raise TimedOut("no data before the deadline")
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def wait_for(self, marker, deadline):
        """True once marker is in the buffer (nothing consumed); False at end of stream."""
        while marker not in self.buf:
            if not self.fill(deadline):
                return False
        return True

    def take_until(self, marker, deadline):
        if not self.wait_for(marker, deadline):
            return None
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def take(self, n, deadline):
        while len(self.buf) < n:
            if not self.fill(deadline):
                out, self.buf = self.buf, b""
                return out
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_to_eof(self, deadline):
        while self.fill(deadline):
            pass
        out, self.buf = self.buf, b""
        return out

    def read_head(self, deadline):
        raw = self.take_until(b"\r\n\r\n", deadline)
        return Head(raw) if raw is not None else None

    def read_chunked(self, deadline):
        """(body, whether the terminator 0\\r\\n\\r\\n was seen)."""
        body = b""
        while True:
            line = self.take_until(b"\r\n", deadline)
            if line is None:
                return body, False
            size = int(line.split(b";")[0].strip() or b"x", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    t = self.take_until(b"\r\n", deadline)
                    if t is None:
                        return body, False
                    if t == b"\r\n":
                        return body, True
            data = self.take(size + 2, deadline)
            if len(data) < size + 2:
                return body + data[:size], False
            assert data[size:] == b"\r\n", f"chunk of {size} not followed by CRLF: {data[-8:]!r}"
            body += data[:size]

    def read_body(self, head, deadline):
        """(body, complete): chunked, Content-Length, or delimited by close."""
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            return self.read_chunked(deadline)
        if "content-length" in head.headers:
            n = int(head.headers["content-length"])
            body = self.take(n, deadline)
            return body, len(body) == n
        return self.read_to_eof(deadline), True

    def close(self, rst=False):
        if rst:  # SO_LINGER (1, 0): close sends RST, not FIN
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def exchange(port, raw, timeout=30.0, what="request"):
    """Sends raw on a new connection and reads one whole reply."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    try:
        c = Conn(port, timeout)
    except OSError as e:
        raise AssertionError(f"{what}: cannot connect: {e}")
    try:
        c.send(raw, tolerant=True)
        head = c.read_head(deadline)
        assert head is not None, f"{what}: connection closed with no status line (reset={c.reset})"
        body, complete = c.read_body(head, deadline)
        return Reply(head, body, complete, time.monotonic() - t0)
    except TimedOut:
        raise TimedOut(f"{what}: no whole reply within {timeout} s")
    finally:
        c.close()


def sse_frames(body):
    """The payloads of `data: ` frames, in order."""
    frames = []
    for block in body.split(b"\n\n"):
        block = block.strip(b"\r\n")
        if block:
            assert block.startswith(b"data: "), f"not an SSE data frame: {block[:100]!r}"
            frames.append(block[6:])
    return frames


def assert_error(reply, status, scenario):
    assert reply.status == status, \
        f"{scenario}: expected {status}, got {reply.status} {reply.body[:300]!r}"
    e = reply.json().get("error")
    assert isinstance(e, dict) and e.get("message"), f"{scenario}: no error object: {reply.body!r}"


def run_threads(target, args_list, timeout, scenario):
    """Runs target(*args) on a daemon thread each; every join is bounded."""
    threads = [threading.Thread(target=target, args=a, daemon=True) for a in args_list]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = sum(t.is_alive() for t in threads)
    assert alive == 0, f"{scenario}: {alive} client threads still running after {timeout} s"


# --- scenarios on the shared server (--read-timeout 2, 4 MB bodies) ---------

def nested_json(srv):
    deep = b"[" * 1_000_000
    bodies = [
        ("prompt [*1e6 unclosed",
         b'{"model": "test-llama", "max_tokens": 4, "prompt": ' + deep + b"}"),
        ("prompt [*1e6 ]*1e6", b'{"model": "test-llama", "max_tokens": 4, "prompt": '
         + deep + b"]" * 1_000_000 + b"}"),
        ("stop [*1e6 ]*1e6", b'{"model": "test-llama", "max_tokens": 4, "prompt": "The ", "stop": '
         + deep + b"]" * 1_000_000 + b"}"),
    ]
    slowest = 0.0
    for what, body in bodies:
        assert len(body) > 1_000_000
        r = exchange(srv.port, request("POST", "/v1/completions", body), 30, f"nested_json {what}")
        assert_error(r, 400, f"nested_json {what}")
        slowest = max(slowest, r.elapsed)
    # 10 MB, over the 4 MB limit: 413, ideally before the body is sent.
    c = Conn(srv.port, 10)
    t0 = time.monotonic()
    c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Content-Length: 10000000\r\n\r\n")
    early = True
    try:
        c.wait_for(b"\r\n", time.monotonic() + 1.0)  # < --read-timeout
    except TimedOut:
        early = False
        c.send(b"x" * 10_000_000, tolerant=True)
    try:
        head = c.read_head(t0 + 10)
    except TimedOut:
        head = None
    c.close()
    assert head is not None, f"nested_json: a 10 MB body got no status line (reset={c.reset})"
    assert head.status_line.startswith("HTTP/1.1 413"), \
        f"nested_json: 10 MB body: {head.status_line}"
    assert_alive_and_pages_free(srv, "nested_json")
    print(f"ok nested_json: 3 bodies nested 1e6 deep refused 400 (slowest {slowest:.2f} s); "
          f"10 MB body 413 {'before' if early else 'after'} its body was sent")


def truncated_body(srv):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    c = Conn(srv.port)
    c.send(head + b'{"model": ')
    c.close()
    c = Conn(srv.port)
    t0 = time.monotonic()
    c.send(head + b'{"model": ')
    try:
        c.read_to_eof(t0 + READ_TIMEOUT + 2)
    except TimedOut:
        raise AssertionError(f"truncated_body: a body 990 bytes short was held open past "
                             f"--read-timeout {READ_TIMEOUT} + 2 s")
    closed = time.monotonic() - t0
    c.close()
    assert_alive_and_pages_free(srv, "truncated_body")
    print(f"ok truncated_body: closed by the client, and closed by the server after {closed:.2f} s")


def chunked_garbage(srv):
    c = Conn(srv.port)
    t0 = time.monotonic()
    c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n", tolerant=True)
    try:
        head = c.read_head(t0 + READ_TIMEOUT + 3)
    except TimedOut:
        raise AssertionError("chunked_garbage: neither an answer nor a close")
    if head is not None:
        assert head.status == 400, f"chunked_garbage: {head.status_line}"
        try:  # 400, then the connection closes
            c.read_to_eof(time.monotonic() + 3)
        except TimedOut:
            raise AssertionError("chunked_garbage: the connection stayed open after the 400")
    c.close()
    assert_alive_and_pages_free(srv, "chunked_garbage")
    print(f"ok chunked_garbage: {head.status_line if head else 'closed'} "
          f"after {time.monotonic() - t0:.2f} s")


def invalid_utf8(srv):
    body = b'{"model": "test-llama", "max_tokens": 4, "prompt": "The \xff\xfe License"}'
    r = exchange(srv.port, request("POST", "/v1/completions", body), 30, "invalid_utf8")
    assert_error(r, 400, "invalid_utf8")
    assert_alive_and_pages_free(srv, "invalid_utf8")
    print(f"ok invalid_utf8: 400 in {r.elapsed * 1000:.1f} ms")


def content_type(srv):
    body = completion_body(max_tokens=2, temperature=0)
    for ct in ("text/plain", None):
        r = exchange(srv.port, request("POST", "/v1/completions", body, content_type=ct), 30,
                     f"content_type {ct}")
        assert_error(r, 415, f"content_type {ct}")
    r = exchange(srv.port, request("POST", "/v1/completions", body,
                                   content_type="application/json; charset=utf-8"), 30)
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 2, (r.status, r.body)
    assert_alive_and_pages_free(srv, "content_type")
    print("ok content_type: text/plain 415, none 415, application/json; charset=utf-8 200")


def http10(srv):
    r = exchange(srv.port, b"GET /health HTTP/1.0\r\n\r\n", 10, "http10 GET /health")
    assert r.head.status_line.startswith("HTTP/1.0 200"), f"http10: {r.head.status_line}"
    c = Conn(srv.port, 30)
    t0 = time.monotonic()
    c.send(request("POST", "/v1/completions", completion_body(max_tokens=8, stream=True),
                   version="1.0"))
    head = c.read_head(t0 + 30)
    assert head is not None, "http10: no reply to a streamed POST"
    assert head.status_line.startswith("HTTP/1.0 200"), f"http10 stream: {head.status_line}"
    te = head.headers.get("transfer-encoding", "")
    assert "chunked" not in te.lower(), f"http10: Transfer-Encoding {te} to an HTTP/1.0 client"
    try:
        body = c.read_to_eof(t0 + 30)
    except TimedOut:
        raise AssertionError("http10: the stream was not ended by closing the connection")
    c.close()
    assert not c.reset, "http10: the stream ended with a reset, not a close"
    assert body.startswith(b"data: ") and b"data: [DONE]" in body, f"http10: body {body[:300]!r}"
    frames = sse_frames(body)
    assert frames[-1] == b"[DONE]", f"http10: last frame {frames[-1]!r}"
    assert_alive_and_pages_free(srv, "http10")
    print(f"ok http10: HTTP/1.0 status lines, a {len(frames)}-frame stream ended by close "
          f"in {time.monotonic() - t0:.2f} s")


def header_too_large(srv):
    raw = request("GET", "/health", headers=["X-Big: " + "a" * 16384])
    r = exchange(srv.port, raw, 10, "header_too_large")
    assert r.status == 431, f"header_too_large: {r.head.status_line}"
    assert_alive_and_pages_free(srv, "header_too_large")
    print(f"ok header_too_large: a 16 KiB header 431 in {r.elapsed * 1000:.1f} ms")


def dropped_streams(srv):
    total, width = 1000, 50
    raw = request("POST", "/v1/completions", completion_body(max_tokens=64, stream=True))
    before = srv.stats()
    errors, lock = [], threading.Lock()
    rst = set(rng.sample(range(total), total // 2))  # half leave with RST, half with FIN

    def client(first):
        for i in range(first, total, width):
            try:
                c = Conn(srv.port, 30)
                deadline = time.monotonic() + 60
                c.send(raw)
                head = c.read_head(deadline)
                assert head is not None and head.status == 200, \
                    f"stream {i}: {head.status_line if head else 'closed'}"
                assert c.wait_for(b"data:", deadline), f"stream {i}: closed before a frame"
                c.close(rst=i in rst)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    run_threads(client, [(w,) for w in range(width)], 120, "dropped_streams")
    took = time.monotonic() - t0
    assert not errors, f"dropped_streams: {len(errors)} failed, e.g. {errors[:3]}"
    s = assert_alive_and_pages_free(srv, "dropped_streams")
    assert s["failed_steps"] == 0, s
    print(f"ok dropped_streams: {total} streams left after their first frame "
          f"({len(rst)} by RST), {width} at a time, in {took:.1f} s; "
          f"{s['tokens_generated'] - before['tokens_generated']} tokens generated")


def served_within_a_second(srv, scenario):
    """A completion of 4 tokens, /health and /keel/stats, each answered 200
    within a second; their latencies."""
    r = exchange(srv.port, request("POST", "/v1/completions",
                                   completion_body(max_tokens=4, temperature=0)), 1.0,
                 f"{scenario} completion")
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 4, (r.status, r.body)
    lat = {"completion": r.elapsed}
    for path in ("/health", "/keel/stats"):
        q = exchange(srv.port, request("GET", path), 1.0, f"{scenario} {path}")
        assert q.status == 200, f"{scenario} {path}: {q.status}"
        lat[path] = q.elapsed
    for what, t in lat.items():
        assert t < 1.0, f"{scenario}: {what} took {t:.2f} s"
    return lat


def slowloris(srv):
    n, trickle = 80, b"X-Slow: " + b"a" * 64
    conns, opened = [], []
    for _ in range(n):
        c = Conn(srv.port, 5)
        c.send(b"POST /v1/completions HTTP/1.1\r\n")
        conns.append(c)
        opened.append(time.monotonic())
    time.sleep(max(0.0, opened[0] + 1.0 - time.monotonic()))
    # While they trickle, a real client is served at once.
    lat = served_within_a_second(srv, "slowloris")
    # One header byte every 2 s; the server must cut each by --read-timeout + 3 s.
    closed = [None] * n
    sent = [0] * n
    next_trickle = opened[0] + 2.0
    deadline = opened[-1] + READ_TIMEOUT + 3
    while None in closed and time.monotonic() < deadline:
        live = {conns[i].sock: i for i in range(n) if closed[i] is None}
        readable, _, _ = select.select(list(live), [], [], 0.05)
        for sock in readable:
            i = live[sock]
            try:
                conns[i].fill(time.monotonic() + 0.5)  # a 408 body, or the end
            except TimedOut:
                continue
            if conns[i].eof:
                closed[i] = time.monotonic()
        if time.monotonic() >= next_trickle:
            for i in range(n):
                if closed[i] is None:
                    if conns[i].send(trickle[sent[i] % len(trickle):][:1], tolerant=True):
                        sent[i] += 1
                    else:
                        closed[i] = time.monotonic()
            next_trickle += 2.0
    for c in conns:
        c.close()
    still = sum(t is None for t in closed)
    assert still == 0, f"slowloris: {still} of {n} trickling connections open after " \
                       f"--read-timeout {READ_TIMEOUT} + 3 s"
    held = [closed[i] - opened[i] for i in range(n)]
    assert max(held) <= READ_TIMEOUT + 3, f"slowloris: held for {max(held):.2f} s"
    assert_alive_and_pages_free(srv, "slowloris")
    print(f"ok slowloris: with {n} trickling, completion {lat['completion'] * 1000:.0f} ms, "
          f"/health {lat['/health'] * 1000:.0f} ms, "
          f"/keel/stats {lat['/keel/stats'] * 1000:.0f} ms; "
          f"all cut after {min(held):.2f}-{max(held):.2f} s")


def idle_sockets(srv):
    # 200 connections that send nothing, and 8 streams running: a request,
    # /health and /keel/stats are each answered within a second.
    idle = [Conn(srv.port, 5) for _ in range(200)]
    streams = [open_stream(srv.port, 400)[0] for _ in range(8)]
    lat = served_within_a_second(srv, "idle sockets")
    for c in idle + streams:
        c.close()
    assert_alive_and_pages_free(srv, "idle_sockets")
    print(f"ok idle_sockets: with 200 idle and 8 streaming, completion "
          f"{lat['completion'] * 1000:.0f} ms, /health {lat['/health'] * 1000:.0f} ms, "
          f"/keel/stats {lat['/keel/stats'] * 1000:.0f} ms")


# --- scenarios with a server of their own -----------------------------------

def overload():
    srv = start("overload", "--max-waiting", "8", "--max-batch", "4")
    n = 200
    raw = request("POST", "/v1/completions", completion_body(max_tokens=32, temperature=0))
    barrier = threading.Barrier(n, timeout=60)
    results, errors, lock = [], [], threading.Lock()
    before = srv.stats()

    def client():
        try:
            c = Conn(srv.port, 30)
            barrier.wait()
            t0 = time.monotonic()
            c.send(raw)
            head = c.read_head(t0 + 120)
            t_head = time.monotonic() - t0
            assert head is not None, "closed with no status line"
            body, complete = c.read_body(head, t0 + 120)
            c.close()
            with lock:
                results.append((head, body, complete, t_head))
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    run_threads(client, [()] * n, 150, "overload")
    assert not errors, f"overload: {len(errors)} clients failed, e.g. {errors[:3]}"
    ok = [r for r in results if r[0].status == 200]
    busy = [r for r in results if r[0].status == 503]
    other = [r[0].status_line for r in results if r[0].status not in (200, 503)]
    assert not other, f"overload: statuses other than 200 and 503: {other[:5]}"
    assert busy, "overload: 200 requests against --max-waiting 8 and not one 503"
    for head, body, complete, t in busy:
        assert "retry-after" in head.headers, f"overload: a 503 without Retry-After: {head.headers}"
        assert t < 1.0, f"overload: a 503 took {t:.2f} s"
        assert json.loads(body)["error"]["message"], body
    for head, body, complete, t in ok:
        assert complete, "overload: a 200 with a truncated body"
        j = json.loads(body)
        assert j["usage"]["completion_tokens"] == 32, j
        assert j["choices"][0]["finish_reason"] == "length", j
    s = assert_alive_and_pages_free(srv, "overload")
    assert s["rejected"] - before["rejected"] >= len(busy), f"overload: rejected {s} < {len(busy)}"
    stop_clean(srv, "overload")
    print(f"ok overload: {len(ok)} served, {len(busy)} refused 503 with Retry-After "
          f"(slowest 503 {max(r[3] for r in busy) * 1000:.0f} ms)")


def kv_exhaustion():
    srv = start("kv", "--pages", "40", "--page-size", "16", "--max-model-len", "512",
                "--max-batch", "16")
    n, prompt = 16, "The GNU General "
    raw = request("POST", "/v1/completions",
                  completion_body(prompt=prompt, max_tokens=400, temperature=0))
    results, errors, lock = [], [], threading.Lock()

    def client():
        try:
            r = exchange(srv.port, raw, 120, "kv_exhaustion request")
            with lock:
                results.append(r)
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    run_threads(client, [()] * n, 130, "kv_exhaustion")
    took = time.monotonic() - t0
    assert not errors, f"kv_exhaustion: {len(errors)} failed (deadlock?), e.g. {errors[:3]}"
    texts = set()
    for r in results:
        assert r.status == 200, f"kv_exhaustion: {r.status} {r.body[:300]!r}"
        j = r.json()
        assert j["choices"][0]["finish_reason"] == "length", j
        assert j["usage"]["completion_tokens"] == 400, j["usage"]
        texts.add(j["choices"][0]["text"])
    # Greedy, one prompt: recomputing a preempted request changes nothing.
    assert len(texts) == 1, f"kv_exhaustion: {len(texts)} different texts from one greedy prompt"
    s = assert_alive_and_pages_free(srv, "kv_exhaustion")
    assert s["preemptions"] > 0, f"kv_exhaustion: 40 pages for 16 x 26 and no preemption: {s}"
    stop_clean(srv, "kv_exhaustion")
    print(f"ok kv_exhaustion: {n} x 400 tokens in 40 pages, {s['preemptions']} preemptions, "
          f"{took:.1f} s, one text")


def max_connections():
    srv = start("maxconn", "--max-connections", "8")
    idle = [Conn(srv.port, 10) for _ in range(8)]
    time.sleep(0.3)  # all 8 accepted
    c = Conn(srv.port, 5)
    t0 = time.monotonic()
    c.send(request("GET", "/health"), tolerant=True)
    try:
        head = c.read_head(t0 + 1.0)
    except TimedOut:
        raise AssertionError("max_connections: the 9th connection got no status line within 1 s")
    t_503 = time.monotonic() - t0
    assert head is not None, f"max_connections: the 9th was closed with no reply (reset={c.reset})"
    assert head.status == 503, f"max_connections: the 9th got {head.status_line}"
    assert "retry-after" in head.headers, f"max_connections: no Retry-After: {head.headers}"
    assert "close" in head.headers.get("connection", "").lower(), \
        f"max_connections: no Connection: close: {head.headers}"
    c.close()
    # One of the 8 leaves: a new client is served.
    idle.pop().close()
    deadline = time.monotonic() + 3
    while True:
        r = exchange(srv.port, request("GET", "/health"), 1.0, "max_connections retry")
        if r.status == 200:
            break
        assert time.monotonic() < deadline, f"max_connections: still {r.status} after one left"
        time.sleep(0.05)
    for c in idle:
        c.close()
    time.sleep(0.2)
    assert_alive_and_pages_free(srv, "max_connections")
    stop_clean(srv, "max_connections")
    print(f"ok max_connections: the 9th refused 503 in {t_503 * 1000:.0f} ms; served once one left")


# --- signals ----------------------------------------------------------------

def open_stream(port, max_tokens, prompt="The "):
    """A streaming request; returns (conn, head) once its first frame arrived."""
    c = Conn(port, 30)
    deadline = time.monotonic() + 30
    body = completion_body(prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True)
    c.send(request("POST", "/v1/completions", body))
    head = c.read_head(deadline)
    assert head is not None and head.status == 200, \
        f"stream: {head.status_line if head else 'closed'}"
    assert c.wait_for(b"data:", deadline), "stream: closed before its first frame"
    return c, head


def sigterm_mid_stream():
    # 4000 tokens, not 480: the tiny model decodes a batch of 8 at ~2.5 ms a
    # step, so 480 tokens could end inside a 2 s drain.
    drain, long_tokens = 2, 4000
    srv = start("drain", "--drain-timeout", str(drain), "--max-model-len", "4096",
                "--pages", "2048")
    plain = Conn(srv.port, 60)  # non-streamed, running when the signal comes
    plain.send(request("POST", "/v1/completions",
                       completion_body(prompt="The ", max_tokens=long_tokens, temperature=0)))
    longs = [open_stream(srv.port, long_tokens) for _ in range(6)]
    shorts = [open_stream(srv.port, 4) for _ in range(2)]
    deadline = time.monotonic() + 10
    while True:
        s = srv.stats()
        if s["running"] >= 7 and s["waiting"] == 0:
            break
        assert time.monotonic() < deadline, f"sigterm_mid_stream: not all running: {s}"
        time.sleep(0.02)
    t0 = time.monotonic()
    srv.send_signal(signal.SIGTERM)
    end = t0 + drain + 10
    out = {}

    def read_stream(key, c, head):
        try:
            body, term = c.read_body(head, end)
            out[key] = (body, term, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - reported below
            out[key] = e

    def read_plain():
        try:
            head = plain.read_head(end)
            assert head is not None, "closed with no status line"
            body, complete = plain.read_body(head, end)
            out["plain"] = Reply(head, body, complete, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - reported below
            out["plain"] = e

    readers = [threading.Thread(target=read_stream, args=(f"long{i}", *sc), daemon=True)
               for i, sc in enumerate(longs)]
    readers += [threading.Thread(target=read_stream, args=(f"short{i}", *sc), daemon=True)
                for i, sc in enumerate(shorts)]
    readers.append(threading.Thread(target=read_plain, daemon=True))
    for t in readers:
        t.start()
    # A new client during the drain: refused, or 503.
    time.sleep(0.1)
    try:
        r = exchange(srv.port, request("GET", "/health"), 1.0, "drain /health")
        newcomer = f"{r.status}"
        assert r.status == 503, f"sigterm_mid_stream: a new client got {r.status} while draining"
    except TimedOut:
        raise AssertionError("sigterm_mid_stream: a new client neither refused nor answered in 1 s")
    except AssertionError as e:
        if "cannot connect" not in str(e) and "no status line" not in str(e):
            raise
        newcomer = "refused"
    for t in readers:
        t.join(timeout=max(0.0, end + 1 - time.monotonic()))
    for key, v in sorted(out.items(), key=lambda kv: kv[0]):
        assert not isinstance(v, Exception), f"sigterm_mid_stream {key}: {type(v).__name__}: {v}"
    assert len(out) == 9, f"sigterm_mid_stream: readers unfinished: {sorted(out)}"
    cut = []
    for i in range(6):
        body, term, at = out[f"long{i}"]
        frames = sse_frames(body)
        assert term, f"sigterm_mid_stream long{i}: no chunked terminator 0\\r\\n\\r\\n"
        assert len(frames) >= 2 and frames[-1] == b"[DONE]", f"long{i}: ends {frames[-2:]!r}"
        assert frames[-2].startswith(b'{"error"'), f"long{i}: no error frame: {frames[-2][:200]!r}"
        assert json.loads(frames[-2])["error"]["message"], frames[-2]
        assert at >= drain - 0.5, \
            f"long{i}: cut {at:.2f} s after SIGTERM, before the drain's {drain} s"
        cut.append(len(frames) - 2)
    for i in range(2):
        body, term, _ = out[f"short{i}"]
        frames = sse_frames(body)
        assert term and frames[-1] == b"[DONE]", \
            f"short{i}: ends {frames[-2:]!r} (terminator {term})"
        finish = [json.loads(f)["choices"][0]["finish_reason"] for f in frames[:-1]
                  if json.loads(f).get("choices")]
        assert finish and finish[-1] == "length", f"short{i}: finish reasons {finish}"
    p = out["plain"]
    assert_error(p, 503, "sigterm_mid_stream non-streamed")
    code = srv.wait(end - time.monotonic())
    took = time.monotonic() - t0
    assert code == 0, f"sigterm_mid_stream: exit status {code} after the drain"
    for c, _ in longs + shorts:
        c.close()
    plain.close()
    print(f"ok sigterm_mid_stream: newcomer {newcomer}; 6 streams cut after {min(cut)}-{max(cut)} "
          f"frames with an error frame, [DONE] and 0\\r\\n\\r\\n; 2 short ones finished; "
          f"non-streamed 503; exit 0 {took:.2f} s after SIGTERM")


def signal_handling_installed(pid):
    """True once the process blocks or catches SIGTERM (its main has begun)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    mask = int(fields.get("SigBlk", "0").strip(), 16) | int(fields.get("SigCgt", "0").strip(), 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def sigterm_startup():
    # A signal before main (while libtorch loads) kills any process, so each
    # delay counts from when keel-serve has taken SIGTERM (/proc/PID/status).
    delays = [0, 0.05, 0.1, 0.2, 0.5, 1.0]
    slowest, early = 0.0, 0
    for i, d in enumerate(delays):
        srv = Server(f"startup{i}", listen=False)
        SERVERS.append(srv)
        deadline = time.monotonic() + 60
        while not signal_handling_installed(srv.proc.pid):
            assert srv.proc.poll() is None, \
                f"sigterm_startup: exited {srv.proc.returncode} at start"
            assert time.monotonic() < deadline, "sigterm_startup: SIGTERM never blocked or caught"
            time.sleep(0.002)
        time.sleep(d)
        early += not os.path.exists(srv.port_file)
        t0 = time.monotonic()
        srv.send_signal(signal.SIGTERM)
        code = srv.wait(15)
        took = time.monotonic() - t0
        assert code == 0, f"sigterm_startup: SIGTERM {d} s into start-up: exit status {code}"
        slowest = max(slowest, took)
    print(f"ok sigterm_startup: {len(delays)} tries exited 0, slowest {slowest:.2f} s after "
          f"SIGTERM ({early} signalled before the port file)")


def second_signal():
    srv = start("second", "--drain-timeout", "30", "--max-model-len", "4096", "--pages", "512")
    c, _ = open_stream(srv.port, 4000)
    srv.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert srv.proc.poll() is None, \
        f"second_signal: exited {srv.proc.returncode} before the drain of a 4000-token stream"
    t0 = time.monotonic()
    srv.send_signal(signal.SIGINT)
    code = srv.wait(3)
    took = time.monotonic() - t0
    c.close()
    assert code == 128 + signal.SIGINT, \
        f"second_signal: exit status {code}, not {128 + signal.SIGINT}"
    print(f"ok second_signal: SIGINT during the drain exited {code} in {took:.2f} s")


# --- the run -----------------------------------------------------------------

def main():
    t_start = time.monotonic()
    passed = 0

    def run(fn, *args):
        nonlocal passed
        first = len(SERVERS)
        try:
            fn(*args)
        except BaseException:
            for s in SERVERS[max(0, first - 1):]:
                print(f"--- {s.log} (last 3000 bytes) ---\n{s.tail()}", file=sys.stderr)
            raise
        passed += 1

    shared = start("hostile", "--max-body-bytes", "4000000", "--read-timeout", str(READ_TIMEOUT))
    for fn in (nested_json, truncated_body, chunked_garbage, invalid_utf8, content_type, http10,
               header_too_large, dropped_streams, slowloris, idle_sockets):
        run(fn, shared)
    stop_clean(shared, "shared server")
    for fn in (overload, kv_exhaustion, max_connections, sigterm_mid_stream, second_signal,
               sigterm_startup):
        run(fn)
    took = time.monotonic() - t_start
    print(f"serve_hostile_test: all {passed} scenarios passed in {took:.0f} s")


main()
