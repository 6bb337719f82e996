"""Python binding of libztclient (ctypes): talk to a running ztd.

    import ztclient
    with ztclient.connect() as c:                  # default socket, like ztctl
        job = c.submit({"model": {...}, "train": {...}, "data": {"source": "stream"}})
        c.push_batch(job, tokens)                  # list of ints, array('i'), or int32 LE bytes
        c.watch(job, lambda ev: print(ev))         # events as dicts until the job ends
        c.export(job, "model.safetensors")
    ztclient.write_tokens("sft.tok", ztclient.chat_documents(tokenizer, examples))  # zttokens.py

Every failure raises ZtError(code, message), e.g. ZtError("EINVAL", "model.n_heads must ...").
The library is $ZTCLIENT_LIB if set; else the one `meson install` put beside this binding's
install (ztclient_install.py, written at install time: relative to this file, then the
configured libdir); else the system's (ctypes.util.find_library, libztclient.so.0).
"""
import array
import ctypes
import ctypes.util
import json
import os
import sys

from zttokens import IGNORE_INDEX, chat_documents, write_tokens

__all__ = ["ZtError", "Client", "connect", "default_socket", "write_tokens", "chat_documents",
           "IGNORE_INDEX"]


class ZtError(Exception):
    """A failure reported by ztd or by the transport: an errno name and a message."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _library_path():
    if os.environ.get("ZTCLIENT_LIB"):
        return os.environ["ZTCLIENT_LIB"]
    try:
        from ztclient_install import LIBDIR, LIBDIR_REL
    except ImportError:  # not installed by meson: the source tree's copy
        LIBDIR = LIBDIR_REL = None
    if LIBDIR:
        here = os.path.dirname(os.path.abspath(__file__))
        for d in (os.path.join(here, LIBDIR_REL), LIBDIR):
            path = os.path.join(d, "libztclient.so.0")
            if os.path.exists(path):
                return path
    return ctypes.util.find_library("ztclient") or "libztclient.so.0"


def _load():
    lib = ctypes.CDLL(_library_path())
    P, S, I, Z = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    PP = ctypes.POINTER(ctypes.c_void_p)
    OUT = ctypes.POINTER(ctypes.c_void_p)  # char ** (kept raw so that we can free it)
    sigs = {
        "zt_client_connect_unix": (I, [PP, S]),
        "zt_client_connect_tcp": (I, [PP, S, I, S]),
        "zt_client_close": (None, [P]),
        "zt_client_interrupt": (None, [P]),
        "zt_client_error_code": (S, [P]),
        "zt_client_error_message": (S, [P]),
        "zt_client_status": (I, [P, OUT]),
        "zt_client_submit_json": (I, [P, S, ctypes.c_char_p]),
        "zt_client_jobs": (I, [P, OUT]),
        "zt_client_plan_json": (I, [P, S, OUT]),
        "zt_client_plan_target_json": (I, [P, S, S, OUT]),
        "zt_client_show": (I, [P, S, OUT]),
        "zt_client_push_batch_docs": (I, [P, S, P, P, P, Z]),
        "zt_client_watch": (I, [P, S, P, P]),
        "zt_client_cancel": (I, [P, S]),
        "zt_client_checkpoint": (I, [P, S, OUT]),
        "zt_client_resume": (I, [P, S, ctypes.c_uint64, OUT]),
        "zt_client_export": (I, [P, S, S]),
        "zt_client_export_hf": (I, [P, S, S, S, ctypes.c_uint64, OUT]),
        "zt_client_shutdown": (I, [P]),
        "zt_client_logs": (I, [P, S, ctypes.c_uint64, OUT]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lib = None
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_WATCH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_JOB_ID_MAX = 64


def _library():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def default_socket():
    """The socket ztctl and ztd use by default: $ZT_SOCKET, $XDG_RUNTIME_DIR/zt/ztd.sock, /tmp/zt-UID."""
    if os.environ.get("ZT_SOCKET"):
        return os.environ["ZT_SOCKET"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(os.environ["XDG_RUNTIME_DIR"], "zt", "ztd.sock")
    return f"/tmp/zt-{os.getuid()}/ztd.sock"


def _tokens_buffer(tokens):
    """(ctypes buffer, count) of int32 little-endian tokens."""
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        raw = bytes(tokens)
        if len(raw) % 4:
            raise ValueError("token bytes must be a whole number of int32 values")
        return ctypes.create_string_buffer(raw, len(raw)), len(raw) // 4
    if isinstance(tokens, array.array) and tokens.itemsize == 4 and tokens.typecode in "il":
        a = tokens
    else:
        a = array.array("i", tokens)
    if sys.byteorder != "little":
        a = array.array("i", a)
        a.byteswap()
    raw = a.tobytes()
    return ctypes.create_string_buffer(raw, len(raw)), len(a)


class Client:
    """One connection to ztd. Not thread-safe: use one Client per thread."""

    def __init__(self, socket=None, tcp=None, token=None):
        lib = _library()
        h = ctypes.c_void_p()
        if tcp is not None:
            host, port = tcp
            rc = lib.zt_client_connect_tcp(ctypes.byref(h), host.encode(), int(port),
                                           (token or "").encode())
        else:
            rc = lib.zt_client_connect_unix(ctypes.byref(h), (socket or default_socket()).encode())
        self._h = h
        if rc < 0:
            err = self._error()
            self.close()
            raise err

    def _error(self):
        lib = _library()
        if not self._h:
            return ZtError("ENOMEM", "out of memory")
        return ZtError(lib.zt_client_error_code(self._h).decode(),
                       lib.zt_client_error_message(self._h).decode(errors="replace"))

    def _check(self, rc):
        if rc < 0:
            raise self._error()
        return rc

    def _json_call(self, fn, *args):
        out = ctypes.c_void_p()
        self._check(fn(self._h, *args, ctypes.byref(out)))
        try:
            return json.loads(ctypes.string_at(out.value).decode())
        finally:
            _libc.free(out)

    def close(self):
        if self._h:
            _library().zt_client_close(self._h)
            self._h = ctypes.c_void_p()

    def interrupt(self):
        """From another thread: make a blocked watch/push_batch raise ZtError('ECONNRESET')."""
        if self._h:
            _library().zt_client_interrupt(self._h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def status(self):
        return self._json_call(_library().zt_client_status)

    def submit(self, spec):
        """spec: a dict or JSON text. Returns the job id."""
        text = spec if isinstance(spec, str) else json.dumps(spec)
        job = ctypes.create_string_buffer(_JOB_ID_MAX)
        self._check(_library().zt_client_submit_json(self._h, text.encode(), job))
        return job.value.decode()

    def plan(self, spec, target=None):
        """spec: a dict or JSON text. Sizes the job as submit would, without queueing it; with
        target (a dict: backend, gpus, gpu_mem_limit, host_mem_limit, nvme_bytes, rates;
        docs/protocol.md "plan") for that machine rather than the daemon's."""
        text = spec if isinstance(spec, str) else json.dumps(spec)
        if target is None:
            return self._json_call(_library().zt_client_plan_json, text.encode())
        return self._json_call(_library().zt_client_plan_target_json, text.encode(),
                               json.dumps(target).encode())

    def jobs(self):
        return self._json_call(_library().zt_client_jobs)["jobs"]

    def show(self, job):
        return self._json_call(_library().zt_client_show, job.encode())

    def push_batch(self, job, tokens, loss_mask=None, doc_starts=None):
        """One micro-batch (micro_batch * (seq_len + 1) tokens); blocks until ztd has room.
        loss_mask, doc_starts: None or a 0/1 a token (docs/protocol.md, batch): which tokens
        count as targets (None: all), which start a document within their row (None: none)."""
        buf, n = _tokens_buffer(tokens)
        marks = []
        for name, m in (("loss_mask", loss_mask), ("doc_starts", doc_starts)):
            if m is not None and len(m) != n:
                raise ValueError(f"{name} has {len(m)} entries for {n} tokens")
            marks.append(None if m is None else ctypes.create_string_buffer(bytes(m), n))
        self._check(_library().zt_client_push_batch_docs(
            self._h, job.encode(), ctypes.cast(buf, ctypes.c_void_p),
            *(ctypes.cast(m, ctypes.c_void_p) if m is not None else None for m in marks), n))

    def watch(self, job, callback):
        """Calls callback(event_dict) per event until the job ends (returns None) or the callback
        returns a true value (returned). Exceptions in the callback stop the watch and propagate."""
        raised = []

        def trampoline(event_json, _user):
            try:
                return 1 if callback(json.loads(event_json.decode())) else 0
            except BaseException as e:  # re-raised below, outside the C frame
                raised.append(e)
                return 1

        cb = _WATCH_CB(trampoline)
        rc = _library().zt_client_watch(self._h, job.encode(), ctypes.cast(cb, ctypes.c_void_p), None)
        if raised:
            raise raised[0]
        self._check(rc)
        return rc or None

    def cancel(self, job):
        self._check(_library().zt_client_cancel(self._h, job.encode()))

    def resume(self, job, steps):
        """Continues a done or cancelled job from its newest checkpoint to `steps` steps in all;
        returns {"job", "state", "steps", "from_step"}."""
        return self._json_call(_library().zt_client_resume, job.encode(), steps)

    def checkpoint(self, job):
        """Waits for the checkpoint; returns {"step", "path"}."""
        return self._json_call(_library().zt_client_checkpoint, job.encode())

    def export(self, job, path):
        self._check(_library().zt_client_export(self._h, job.encode(), os.fsencode(path)))

    def logs(self, job, offset=0):
        """A piece of the job's log: {"data", "offset" (the next piece's), "size", "state"}."""
        return self._json_call(_library().zt_client_logs, job.encode(), offset)

    def export_hf(self, job, path, dtype="bf16", max_shard_size=0):
        """The latest checkpoint as a Hugging Face directory at path (waits while ztd converts
        it); returns the listing {"export", "step", "dtype", "files", "note"?}."""
        return self._json_call(_library().zt_client_export_hf, job.encode(), os.fsencode(path),
                               dtype.encode(), max_shard_size)

    def shutdown(self):
        self._check(_library().zt_client_shutdown(self._h))


def connect(socket=None, tcp=None, token=None):
    """Connects over the Unix socket (default rule as ztctl) or tcp=(host, port) with token."""
    return Client(socket=socket, tcp=tcp, token=token)
