"""The Python binding without a daemon: it loads libztclient, and a failed connection raises
ZtError with the errno name and the library's message."""
import os
import sys
import tempfile

os.environ["ZTCLIENT_LIB"] = sys.argv[1]
import ztclient  # noqa: E402

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "none.sock")
    try:
        ztclient.connect(socket=path)
    except ztclient.ZtError as e:
        assert e.code == "ENOENT", e.code
        assert e.message == f"cannot connect to {path}: No such file or directory", e.message
    else:
        raise AssertionError("connect to a missing socket succeeded")

try:
    ztclient.connect(tcp=("127.0.0.1", 1), token="x")
except ztclient.ZtError as e:
    assert e.code == "ECONNREFUSED", e.code
    assert "cannot connect to 127.0.0.1:1" in e.message, e.message
else:
    raise AssertionError("connect to a closed port succeeded")

buf, n = ztclient._tokens_buffer([1, 2, 70000])
assert n == 3 and buf.raw == b"\x01\x00\x00\x00\x02\x00\x00\x00\x70\x11\x01\x00", buf.raw
buf, n = ztclient._tokens_buffer(b"\x05\x00\x00\x00")
assert n == 1
os.environ["ZT_SOCKET"] = "/x/y.sock"
assert ztclient.default_socket() == "/x/y.sock"
print("ok")
