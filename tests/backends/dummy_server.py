"""A stand-in 'vLLM server' for supervisor tests: optional delay, /health, optional grandchild."""

import http.server
import os
import socket
import subprocess
import sys
import time
import uuid

port, delay, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if mode == "crash":
    print("dummy server crashing on purpose", flush=True)
    sys.exit(3)
if mode == "grandchild":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"grandchild {child.pid}", flush=True)
time.sleep(delay)
# like vLLM's engine: a ZeroMQ IPC socket under VLLM_RPC_BASE_PATH, left when killed
ipc = socket.socket(socket.AF_UNIX)
ipc.bind(os.path.join(os.environ.get("VLLM_RPC_BASE_PATH", "/nonexistent"), str(uuid.uuid4())))
print(f"rpc {os.environ['VLLM_RPC_BASE_PATH']}", flush=True)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
