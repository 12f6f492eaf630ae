"""The host agent's code as it travels: every module of tasks/hostside, hashed, and its bootstrap.

The payload is every `*.py` of tasks/hostside (found, not listed: a module added
there travels without editing anything; which op each serves is the table in
hostside/ops.py). Its content hash names the copy on the host.

The one remote command per task and host is `PYTHON -S -c BOOTSTRAP DIGEST`. The
bootstrap looks for `~/.cache/llmfab/agent/<digest>/` (XDG_CACHE_HOME respected),
checks that the directory is the user's own, not writable by others, and that its
files hash to DIGEST, then imports the agent from there, so the profile's Python
caches the bytecode beside it (`__pycache__`) and compiles nothing on later starts.
Otherwise it prints `{"need": 1}` and reads the payload (one JSON line) from stdin,
writes it into a fresh 0700 directory, verifies the hash again and renames it into
place; a tampered or half-written copy is moved aside and removed, never run. Where
the cache cannot be written (read-only home) it runs from a private temporary copy.
Its first output line after that is the agent's hello record (agent.serve(greet=...)).
When the client closes the channel the agent ends at once (os._exit: every answer is
flushed and nothing else needs an orderly interpreter shutdown, which cost each task
a few ms of CPU per host).
Bytecode is written even under PYTHONDONTWRITEBYTECODE: the cache directory is ours,
and compiling ~90 KB of sources is most of a cold start.
"""
import hashlib
import json
import os
import threading
from pathlib import Path

HOSTSIDE = Path(__file__).with_name("hostside")

# -S: no site start-up. The agent needs only the standard library, and an ML environment's
# site (its .pth files) would cost every task on every host; what looks up an installed
# package calls hostside.common.site_packages() first.
AGENT_FLAGS = ("-S",)

# Kept in step with digest() below (the same bytes hashed on both sides). Short names:
# it travels as one argv word through the remote shell on every task. sha256 from the
# built-in module where there is one: hashlib loads OpenSSL (~2.5 ms of every start).
BOOTSTRAP = r"""import sys,os,json
try:from _sha2 import sha256
except ImportError:
 try:from _sha256 import sha256
 except ImportError:from hashlib import sha256
H=sys.argv[1]
def dig(d):
 s=sha256()
 for n in sorted(os.listdir(d)):
  if n.endswith('.py'):
   with open(os.path.join(d,n),'rb') as f:b=f.read()
   s.update(b'%s\0%d\0'%(n.encode(),len(b))+b)
 return s.hexdigest()
def good(v):
 try:
  st=os.stat(v)
  return st.st_uid==os.getuid() and not st.st_mode&0o22 and dig(os.path.join(v,'llmfab_host'))==H
 except OSError:return False
R=os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'),'llmfab','agent')
V=os.path.join(R,H[:32]);I,O=sys.stdin.buffer,sys.stdout.buffer;how='cached'
if not good(V):
 import tempfile,shutil,time
 O.write(b'{"need": 1}\n');O.flush();F=json.loads(I.readline());how='sent'
 try:
  os.makedirs(R,0o700,exist_ok=True);T=tempfile.mkdtemp(dir=R)
 except OSError:
  T=tempfile.mkdtemp(prefix='llmfab-agent-');how='temporary'
 P=os.path.join(T,'llmfab_host');os.mkdir(P,0o700)
 for n,s in F:
  with open(os.path.join(P,n),'wb') as f:f.write(s.encode())
 if dig(P)!=H:sys.exit('llmfab agent: the code received does not match its hash %s'%H)
 if how=='sent':
  for e in os.listdir(R):
   p=os.path.join(R,e)
   try:
    if p!=T and (p==V or os.stat(p).st_mtime<time.time()-(3600 if e.startswith('tmp') else 2592000)):
     X=tempfile.mkdtemp(dir=R);os.rename(p,os.path.join(X,'old'));shutil.rmtree(X,True)
   except OSError:pass
  try:os.rename(T,V)
  except OSError:
   shutil.rmtree(T,True)
   if not good(V):raise
 else:V=T
else:
 try:os.utime(V)
 except OSError:pass
sys.path.insert(0,V);sys.dont_write_bytecode=False
from llmfab_host import agent
agent.serve(I,O,greet={'agent_dir':V,'code':how})
O.flush();os._exit(0)
"""


def digest(files):
    """sha256 over (name, length, bytes) of each file, sorted by name: what the bootstrap computes."""
    h = hashlib.sha256()
    for name, data in sorted(files):
        h.update(b"%s\0%d\0" % (name.encode(), len(data)) + data)
    return h.hexdigest()


class Payload:
    """files: [(file name, bytes)]; digest; line: the JSON line the bootstrap reads."""

    def __init__(self, directory=HOSTSIDE):
        self.files = []
        for name in sorted(n for n in os.listdir(directory) if n.endswith(".py")):
            with open(os.path.join(directory, name), "rb") as f:
                self.files.append((name, f.read()))
        self.digest = digest(self.files)

    @property
    def line(self):
        """Built only for a host that lacks this version (most starts never need it)."""
        return json.dumps([(n, d.decode("utf-8")) for n, d in self.files]).encode() + b"\n"


_cache = {}
_cache_lock = threading.Lock()


def payload(directory=HOSTSIDE):
    """The payload of `directory`, built once per process (every host's thread asks at once)."""
    key = str(directory)
    with _cache_lock:
        if key not in _cache:
            _cache[key] = Payload(directory)
        return _cache[key]
