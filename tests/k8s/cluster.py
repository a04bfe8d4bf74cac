"""A real, throw-away Kubernetes control plane for tests: etcd + kube-apiserver +
kube-controller-manager (Kubernetes 1.20, built by ``tests/k8s/build-kube.sh``) on loopback.

No kubelet and no scheduler: pods are stored but never run; tests create Node objects themselves.
The controller manager runs the usual controllers (garbage collector, namespace, service-account
and token controllers, ReplicaSet/Deployment, ...), minus ``nodelifecycle`` by default, which would
otherwise mark test-made Nodes NotReady/unreachable because no kubelet ever heartbeats for them.

Usage::

    with KubeCluster(find_binaries()) as cluster:
        subprocess.run(["kubectl", "get", "ns"], env=cluster.env(), check=True)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-kube.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
DEFAULT_CONTROLLERS = ("*", "-nodelifecycle")
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"

_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt
[alt]
IP.1 = 127.0.0.1
IP.2 = 10.96.0.1
DNS.1 = localhost
DNS.2 = kubernetes
DNS.3 = kubernetes.default
DNS.4 = kubernetes.default.svc
DNS.5 = kubernetes.default.svc.cluster.local
"""


class KubeClusterError(RuntimeError):
    """The control plane could not be built, started or reached."""


def cache_dir() -> Path:
    """Where build-kube.sh caches the binaries (``$HORIZONSERVE_KUBE_CACHE``)."""
    env = os.environ.get("HORIZONSERVE_KUBE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "horizonserve" / "kube-1.20"


def missing_binaries(bin_dir: Path | None = None) -> list[str]:
    bin_dir = bin_dir or cache_dir() / "bin"
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def find_binaries(build: bool = True, build_output: int | None = None) -> Path:
    """Return the directory holding etcd/kube-apiserver/kube-controller-manager.

    When any is missing and ``build`` is true, run build-kube.sh (about 10 minutes on 2 cores,
    needs root or passwordless sudo for apt-get); raise KubeClusterError if that fails.
    ``build_output`` is passed as the build's stdout/stderr (None: inherit).
    """
    bin_dir = cache_dir() / "bin"
    missing = missing_binaries(bin_dir)
    if not missing:
        return bin_dir
    if not build:
        raise KubeClusterError(f"missing {', '.join(missing)} in {bin_dir}; run {BUILD_SCRIPT}")
    print(
        f"[kube] {', '.join(missing)} not in {bin_dir}: running {BUILD_SCRIPT} (~10 min)",
        file=sys.stderr,
        flush=True,
    )
    rc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdin=subprocess.DEVNULL,
        stdout=build_output,
        stderr=build_output,
        check=False,
    ).returncode
    missing = missing_binaries(bin_dir)
    if rc != 0 or missing:
        raise KubeClusterError(
            f"{BUILD_SCRIPT} exited {rc}; still missing: {', '.join(missing) or 'nothing'}"
        )
    return bin_dir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Kill the child when the test process dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"  <{exc}>"
    return "\n".join("  " + line for line in text[-lines:])


class KubeCluster:
    """etcd + kube-apiserver + kube-controller-manager in a temp dir, on free loopback ports.

    Auth: a static token for user ``horizonserve-admin`` in group ``system:masters``
    (``.token``); authorization is RBAC, so ``kubectl --as=...`` impersonation sees real RBAC.
    TLS: a throw-away CA (``.ca_file``) signs the serving cert for 127.0.0.1/localhost, so the
    kubeconfig verifies the server (no insecure-skip-tls-verify needed).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        *,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        startup_timeout: float = 120.0,
        keep: bool | None = None,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else find_binaries(build=False)
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="hs-kube-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.controllers = tuple(controllers)
        self.startup_timeout = startup_timeout
        self.keep = os.environ.get("HORIZONSERVE_KUBE_KEEP") == "1" if keep is None else keep
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.extra_controller_manager_args = tuple(extra_controller_manager_args)

        self.token = secrets.token_hex(16)
        self.user = "horizonserve-admin"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ca_file = self.workdir / "pki" / "ca.crt"
        self.logs_dir = self.workdir / "logs"
        self.etcd_port = 0
        self.port = 0
        self.server = ""
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}  # seconds per startup phase
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._ssl: ssl.SSLContext | None = None
        self._stopped = False
        atexit.register(self.stop)

    # ---------------------------------------------------------------- public API

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for subprocesses (kubectl, the operator): KUBECONFIG points here."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["KUBECACHEDIR"] = str(self.workdir / "kubectl-cache")
        return env

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the installed kubectl against this cluster (text mode)."""
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise KubeClusterError("kubectl is not installed")
        return subprocess.run(
            [kubectl, "--kubeconfig", str(self.kubeconfig), *args],
            env=self.env(),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def start(self) -> KubeCluster:
        t0 = time.monotonic()
        try:
            self._write_pki()
            self.timings["pki"] = time.monotonic() - t0
            for attempt in range(3):
                self.etcd_port, self.port = free_port(), free_port()
                self.server = f"https://127.0.0.1:{self.port}"
                try:
                    t = time.monotonic()
                    self._start_etcd()
                    self.timings["etcd"] = time.monotonic() - t
                    t = time.monotonic()
                    self._start_apiserver()
                    self.timings["kube-apiserver"] = time.monotonic() - t
                    break
                except KubeClusterError:
                    if attempt == 2 or not self._port_clash():
                        raise
                    self._terminate_all()  # lost a race for a port: new ports, again
            self._write_kubeconfig()
            t = time.monotonic()
            self._start_controller_manager()
            self.wait_for_default_service_account("default")
            self.timings["kube-controller-manager"] = time.monotonic() - t
        except BaseException as exc:
            msg = f"{exc}\n{self.describe_logs()}"
            print(f"[kube] cluster startup failed: {msg}", file=sys.stderr, flush=True)
            self.stop(keep_logs=True)
            if isinstance(exc, KubeClusterError):
                raise KubeClusterError(msg) from exc
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self, keep_logs: bool = False) -> None:
        """Kill every process (controller manager, apiserver, etcd) and remove the temp dir.

        A workdir passed in by the caller is kept (minus the etcd data); so are the logs with
        ``keep_logs`` (after a failed start), and everything with ``keep`` (or
        HORIZONSERVE_KUBE_KEEP=1).
        """
        if self._stopped:
            return
        self._stopped = True
        self._terminate_all()
        atexit.unregister(self.stop)
        if self.keep:
            return
        if self._own_workdir and not keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)
            return
        for child in self.workdir.iterdir() if self.workdir.exists() else ():
            if child.name == "etcd" or (self._own_workdir and child != self.logs_dir):
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)

    def describe_logs(self, lines: int = 40) -> str:
        parts = []
        for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
            log = self.logs_dir / f"{name}.log"
            if log.exists():
                proc = self._procs.get(name)
                state = "" if proc is None else f" (exit code {proc.poll()})"
                parts.append(f"--- last {lines} lines of {log}{state}:\n{_tail(log, lines)}")
        return "\n".join(parts)

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        """One authenticated API call (stdlib only). Returns (HTTP status, decoded JSON/text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl_context()) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def wait_for_default_service_account(self, namespace: str, timeout: float = 60.0) -> None:
        """Wait until the namespace's ``default`` ServiceAccount has its token secret.

        Pods are rejected by the ServiceAccount admission plugin until then (Kubernetes 1.20
        mounts secret-based tokens), so call this after creating a namespace for pods.
        """
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/default"

        def ready() -> bool:
            status, sa = self.request("GET", path)
            return status == 200 and bool(sa.get("secrets"))

        self._wait(f"default ServiceAccount with token in namespace {namespace!r}", ready, timeout)

    def wait_crd_established(self, name: str, timeout: float = 60.0) -> None:
        """Wait until CRD `name` reports Established=True.

        Not `kubectl wait --for=condition=Established`: on a CRD created a moment before,
        whose status has no conditions yet, that fails at once instead of waiting.
        """
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"

        def established() -> bool:
            status, crd = self.request("GET", path)
            if status != 200:
                return False
            conditions = (crd.get("status") or {}).get("conditions") or []
            return any(
                c.get("type") == "Established" and c.get("status") == "True" for c in conditions
            )

        self._wait(f"CRD {name} Established", established, timeout)

    # ---------------------------------------------------------------- internals

    def _binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise KubeClusterError(f"{path} missing or not executable (run {BUILD_SCRIPT})")
        return str(path)

    def _openssl(self, *args: str) -> None:
        res = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise KubeClusterError(f"openssl {' '.join(args)} failed:\n{res.stderr}")

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        cnf = pki / "openssl.cnf"
        cnf.write_text(_OPENSSL_CNF)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl(
            "req", "-x509", *ec, "-config", str(cnf), "-extensions", "v3_ca",
            "-subj", "/CN=horizonserve-test-ca", "-days", "30",
            "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
        )  # fmt: skip
        self._openssl(
            "req", "-new", *ec, "-config", str(cnf), "-subj", "/CN=kube-apiserver",
            "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"),
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", str(pki / "apiserver.csr"), "-days", "30",
            "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"), "-CAcreateserial",
            "-extfile", str(cnf), "-extensions", "v3_server", "-out", str(pki / "apiserver.crt"),
        )  # fmt: skip
        # Service-account token signing key pair.
        self._openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
        (pki / "tokens.csv").write_text(f'{self.token},{self.user},uid-admin,"system:masters"\n')

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (self.logs_dir / f"{name}.log").open("ab")
        try:
            proc = subprocess.Popen(
                [self._binary(name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            log.close()
        self._procs[name] = proc
        return proc

    def _wait(self, what: str, ok: Any, timeout: float, proc: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        last_err = ""
        while True:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise KubeClusterError(f"{name} exited with {p.returncode} waiting for {what}")
            try:
                if ok():
                    return
            except (OSError, ValueError, AttributeError) as exc:
                last_err = f" (last error: {exc})"
            if time.monotonic() > deadline:
                raise KubeClusterError(
                    f"timed out after {timeout:.0f}s waiting for {what}{last_err}"
                )
            time.sleep(0.2)

    def _start_etcd(self) -> None:
        peer = free_port()
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer}"
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        self._spawn(
            "etcd",
            [
                "--name=hs",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=hs={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        self._wait("etcd /health", healthy, 30)

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                "--insecure-port=0",  # 1.20 would otherwise also listen on 127.0.0.1:8080
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
                *self.extra_apiserver_args,
            ],
        )
        self._ssl = None

        def ready() -> bool:
            status, body = self.request("GET", "/readyz", timeout=5)
            return status == 200 and str(body).strip() == "ok"

        self._wait("kube-apiserver /readyz", ready, self.startup_timeout)

    def _start_controller_manager(self) -> None:
        pki = self.workdir / "pki"
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                "--port=0",  # no insecure serving (1.20 default 10252)
                "--secure-port=0",  # no secure serving (default 10257): nothing to clash with
                "--leader-elect=false",
                f"--controllers={','.join(self.controllers)}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--enable-garbage-collector=true",
                "--v=1",
                *self.extra_controller_manager_args,
            ],
        )

    def _port_clash(self) -> bool:
        for name in ("etcd", "kube-apiserver"):
            log = self.logs_dir / f"{name}.log"
            if log.exists() and "address already in use" in log.read_text(errors="replace"):
                return True
        return False

    def _terminate_all(self) -> None:
        procs = list(self._procs.items())[::-1]  # controller manager, apiserver, etcd
        for _name, p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _name, p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
        self._procs.clear()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "horizonserve-test",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": self.user, "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "horizonserve-test",
                    "context": {
                        "cluster": "horizonserve-test",
                        "user": self.user,
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "horizonserve-test",
        }
        # JSON is valid YAML: every kubeconfig reader accepts it.
        self.kubeconfig.write_text(json.dumps(config, indent=2) + "\n")
        self.kubeconfig.chmod(0o600)


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.2
) -> T:
    """Poll until `probe` returns something truthy; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
