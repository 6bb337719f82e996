#!/bin/bash
# The Python binding (client/python/ztclient.py over libztclient) driving a real ztd:
# python_client.py says what it checks. ZTCLIENT_LIB and PYTHONPATH come from meson.
. "$(dirname "$0")/lib.sh"

start_ztd
python3 "$(dirname "$0")/python_client.py" "$SOCK" "$ZT_TMP" || fail "python client"
stop_ztd
echo "python_client: ok"
