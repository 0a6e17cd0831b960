"""Build the worker image and the NIC helper image, and push them to the rack's registry.

The worker's base is a debootstrap minbase with python3 and the pinned wheels of
requirements.txt (installed from this host, so no pip in the image), stripped of what the worker
never loads (torch's headers, tests, test binaries); the worker is built on top. The helper image
holds the CNI host-device and static plugins, busybox and iproute2's `ip` with their libraries,
all taken from Debian packages set-up installs, made with `docker import`. Each image carries a
label with the hash of its inputs; a build whose inputs are unchanged is skipped, so `make image`
is cheap to repeat. `push` tags and pushes both to a registry unless it holds them already.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE = "bookworm"
BASE_PACKAGES = ["python3", "iproute2", "iputils-ping", "ethtool", "procps"]
# OPTIRACK_IMAGE_TAG: build and use the images under another tag (several checkouts on one host).
TAG = os.environ.get("OPTIRACK_IMAGE_TAG", "latest")
BASE_IMAGE = f"optirack-base:{TAG}"
WORKER_IMAGE = f"optirack-worker:{TAG}"
LABEL = "org.optirack.inputs"
RECIPE = "3"  # bump when the way the base is made changes
PYTHON_SITE = "usr/local/lib/python3.11/dist-packages"  # Debian's python3 looks here
# Never loaded by the worker: C++ headers, torch's own tests and test binaries, docs.
STRIP = [
    "torch/include",
    "torch/test",
    "torch/share",
    "torch/bin/protoc",
    "torch/bin/protoc-3.13.0.0",
    "torch/bin/FileStoreTest",
    "torch/bin/HashStoreTest",
    "torch/bin/TCPStoreTest",
    "torch/bin/test_aoti_abi_check",
]
DOCS = [
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "var/cache/debconf",
]


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def base_inputs() -> str:
    return _digest(
        RECIPE.encode(), SUITE.encode(), " ".join(BASE_PACKAGES).encode(), (HERE / "requirements.txt").read_bytes()
    )


def worker_inputs(base_id: str) -> str:
    root = HERE.parent  # the build context: containers/ and the profiles it shares with the controller
    files = sorted(
        p for d in (HERE, root / "profiles") for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    return _digest(base_id.encode(), *(str(p.relative_to(root)).encode() + p.read_bytes() for p in files))


def debian_mirror() -> str:
    if os.environ.get("OPTIRACK_DEBIAN_MIRROR"):
        return os.environ["OPTIRACK_DEBIAN_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", text, re.M
        )
        if m:
            return m.group(1)
    return "http://deb.debian.org/debian"


def _run(cmd: list[str], what: str) -> None:
    t0 = time.monotonic()
    print(f"    {what} ...", flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"image build failed: {what}: {cmd[0]} exited {proc.returncode}")
    print(f"    {what}: {time.monotonic() - t0:.0f} s", flush=True)


def _labelled(client, tag: str, want: str):
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return image if (image.labels or {}).get(LABEL) == want else None


def build_base(client, workdir: Path) -> None:
    want = base_inputs()
    rootfs = workdir / "rootfs"
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            SUITE,
            str(rootfs),
            debian_mirror(),
        ],
        f"debootstrap {SUITE} (minbase, python3)",
    )
    site = rootfs / PYTHON_SITE
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--target",
            str(site),
            "-r",
            str(HERE / "requirements.txt"),
        ],
        "install the pinned wheels into the rootfs",
    )
    for junk in STRIP:
        target = site / junk
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    for junk in DOCS:
        shutil.rmtree(rootfs / junk, ignore_errors=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts of the wheels
    # (torch ships a file of Python 3.12 syntax for its tests: skipped, as pip does)
    _run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", "py312", "-d", f"/{PYTHON_SITE}", str(site)],
        "byte-compile",
    )
    tar = workdir / "base.tar"
    _run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], "pack the rootfs")
    t0 = time.monotonic()
    with open(tar, "rb") as f:
        client.api.import_image(
            src=f,
            repository=BASE_IMAGE.split(":")[0],
            tag=BASE_IMAGE.split(":")[1],
            changes=[f"LABEL {LABEL}={want}", "LABEL org.optirack.role=base", 'CMD ["python3"]'],
        )
    print(f"    docker import: {time.monotonic() - t0:.0f} s", flush=True)


def build_worker(client, base_id: str, base: str = BASE_IMAGE) -> None:
    t0 = time.monotonic()
    client.images.build(
        path=str(ROOT),
        dockerfile="containers/Dockerfile",
        tag=WORKER_IMAGE,
        rm=True,
        buildargs={"BASE": base},
        labels={LABEL: worker_inputs(base_id)},
    )
    print(f"    docker build {WORKER_IMAGE}: {time.monotonic() - t0:.0f} s", flush=True)


def ensure_images(check_only: bool = False, force: bool = False, worker_base: str | None = None) -> bool:
    """Build what is missing or stale; returns True if all images are up to date. `worker_base`: the worker on that
    image (e.g. a CUDA PyTorch one, which must be on this engine) instead of optirack-base; its label holds that
    base's id, so a later run with the same base (and `--push`) keeps it rather than rebuilding on the CPU base."""
    import docker

    client = docker.from_env()
    if not ensure_helper(client, check_only, force):
        return False
    if worker_base is not None:
        try:
            base = client.images.get(worker_base)
        except docker.errors.ImageNotFound:
            raise SystemExit(f"--worker-base {worker_base}: no such image on this engine (docker pull it first)") \
                from None
    else:
        base = None if force else _labelled(client, BASE_IMAGE, base_inputs())
    if base is None:
        if check_only:
            return False
        print(f"==> building {BASE_IMAGE} (takes a few minutes once)", flush=True)
        with tempfile.TemporaryDirectory(dir=ROOT / "build" if (ROOT / "build").is_dir() else None) as tmp:
            build_base(client, Path(tmp))
        base = client.images.get(BASE_IMAGE)
    else:
        print(f"    {BASE_IMAGE} up to date")
    worker = None if force else _labelled(client, WORKER_IMAGE, worker_inputs(base.id))
    if worker is None:
        if check_only:
            return False
        print(f"==> building {WORKER_IMAGE} on {worker_base or BASE_IMAGE}", flush=True)
        build_worker(client, base.id, worker_base or BASE_IMAGE)
    else:
        print(f"    {WORKER_IMAGE} up to date")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="build-image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if an image is missing or stale; build nothing")
    parser.add_argument("--force", action="store_true", help="rebuild the images even if they are up to date")
    parser.add_argument("--push", metavar="REGISTRY", help="then push both to REGISTRY (HOST:PORT) unless it has them")
    parser.add_argument(
        "--worker-base", metavar="IMAGE",
        help="build the worker on IMAGE (e.g. a CUDA PyTorch image already on this engine) instead of the CPU "
        "optirack-base; give it again with --push, or the worker is rebuilt on the CPU base (it is labelled with "
        "the base it was built on)")
    args = parser.parse_args(argv)
    if not ensure_images(check_only=args.check, force=args.force, worker_base=args.worker_base):
        return 1
    if args.push:
        import docker

        for ref in push(docker.from_env(), args.push).values():
            print(f"    {ref}")
    return 0


# --- the NIC helper image -------------------------------------------------------------------------
HELPER_IMAGE = "optirack-cni:1"  # bump the tag when the helper changes (the rack file names it)
HELPER_FILES = ["/usr/lib/cni/host-device", "/usr/lib/cni/static", "/sbin/ip", "/bin/busybox"]
HELPER_SCRIPT = HERE / "helper" / "optirack-nic"


def _libraries(binary: str) -> list[str]:
    """The shared libraries a binary loads (from ldd), the dynamic loader included."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(path)
    return libs


def helper_inputs() -> str:
    files = sorted({f for b in HELPER_FILES for f in [b, *_libraries(b)]})
    return _digest(HELPER_SCRIPT.read_bytes(), *(f.encode() + Path(f).read_bytes() for f in files))


def helper_tar(path: Path) -> None:
    """A root filesystem of the helper's files, with fixed owners and times (the same bytes each time)."""
    import tarfile

    files = sorted({f for b in HELPER_FILES for f in [b, *_libraries(b)]})
    applets = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()

    def add(tar, name: str, data: bytes | None = None, mode: int = 0o755, link: str | None = None) -> None:
        info = tarfile.TarInfo(name.lstrip("/"))
        info.mtime, info.mode = 0, mode
        if link:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        elif data is None:
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    with tarfile.open(path, "w") as tar:
        for d in (
            "bin",
            "sbin",
            "tmp",
            "proc",
            "sys",
            "dev",
            "etc",
            "usr",
            "usr/lib",
            "usr/lib/cni",
            "lib",
            "lib64",
            "lib/x86_64-linux-gnu",
        ):
            add(tar, d, mode=0o1777 if d == "tmp" else 0o755)
        for f in files:
            add(tar, f, Path(f).read_bytes(), mode=0o755)
        for applet in applets:
            if applet not in ("ip", "busybox"):
                add(tar, f"bin/{applet}", link="busybox")
        add(tar, "bin/optirack-nic", HELPER_SCRIPT.read_bytes())


def ensure_helper(client, check_only: bool = False, force: bool = False) -> bool:
    """Build the helper image if it is missing or its inputs changed."""
    want = helper_inputs()
    if not force and _labelled(client, HELPER_IMAGE, want) is not None:
        print(f"    {HELPER_IMAGE} up to date")
        return True
    if check_only:
        return False
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "helper.tar"
        helper_tar(tar)
        with open(tar, "rb") as f:
            client.api.import_image(
                src=f,
                repository=HELPER_IMAGE.split(":")[0],
                tag=HELPER_IMAGE.split(":")[1],
                changes=[f"LABEL {LABEL}={want}", "LABEL org.optirack.role=helper", 'ENTRYPOINT ["/bin/optirack-nic"]'],
            )
    size = client.images.get(HELPER_IMAGE).attrs["Size"]
    print(f"==> built {HELPER_IMAGE} ({size / 1e6:.1f} MB) in {time.monotonic() - t0:.1f} s", flush=True)
    return True


# --- pushing to a registry ------------------------------------------------------------------------
def push(client, registry: str, images: tuple[str, ...] = (WORKER_IMAGE, HELPER_IMAGE)) -> dict[str, str]:
    """Tag and push each image to `registry` unless it holds this very image; returns name -> repo@digest."""
    refs = {}
    for name in images:
        image = client.images.get(name)
        repo, tag = f"{registry}/{name.split(':')[0]}", name.split(":")[1]
        known = [d for d in image.attrs.get("RepoDigests") or [] if d.startswith(repo + "@")]
        if known and _registry_has(client, f"{repo}:{tag}", known[0].split("@")[1]):
            refs[name] = known[0]
            continue
        image.tag(repo, tag)
        t0 = time.monotonic()
        print(f"    pushing {name} to {registry} ...", flush=True)
        for line in client.api.push(repo, tag=tag, stream=True, decode=True):
            if "error" in line:
                raise SystemExit(f"pushing {name} to {registry} failed: {line['error']}")
        image.reload()
        digest = next(d for d in image.attrs["RepoDigests"] if d.startswith(repo + "@"))
        print(f"    pushed {name} in {time.monotonic() - t0:.0f} s: {digest}", flush=True)
        refs[name] = digest
    return refs


def _registry_has(client, ref: str, digest: str) -> bool:
    """Whether the registry's tag `ref` points at `digest` (asked through the engine)."""
    try:
        return client.images.get_registry_data(ref).id == digest
    except Exception:  # noqa: BLE001 (missing tag or registry down: push)
        return False


if __name__ == "__main__":
    sys.exit(main())
