"""Build the worker image with no registry: debootstrap a base, `docker import` it, build on top.

Each image carries a label with the hash of its inputs; a build whose inputs are unchanged is
skipped, so `make image` is cheap to repeat.
"""
from __future__ import annotations

import argparse
import hashlib
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
BASE_PACKAGES = ["python3", "python3-pip", "iproute2", "iputils-ping", "ethtool", "procps", "ca-certificates"]
BASE_IMAGE = "optirack-base:latest"
WORKER_IMAGE = "optirack-worker:latest"
LABEL = "org.optirack.inputs"
RECIPE = "2"  # bump when the way the base is made changes


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def base_inputs() -> str:
    return _digest(RECIPE.encode(), SUITE.encode(), " ".join(BASE_PACKAGES).encode(),
                   (HERE / "requirements.txt").read_bytes())


def worker_inputs(base_id: str) -> str:
    files = sorted(p for p in HERE.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return _digest(base_id.encode(), *(str(p.relative_to(HERE)).encode() + p.read_bytes() for p in files))


def debian_mirror() -> str:
    if os.environ.get("OPTIRACK_DEBIAN_MIRROR"):
        return os.environ["OPTIRACK_DEBIAN_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+/debian)\s*$", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)\s", text, re.M)
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
    _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), debian_mirror()],
         f"debootstrap {SUITE} (minbase, python3)")
    wheels = rootfs / "tmp" / "wheels"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "-r", str(HERE / "requirements.txt")],
         "fetch pinned wheels")
    shutil.copy(HERE / "requirements.txt", wheels / "requirements.txt")
    _run(["chroot", str(rootfs), "python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", "/tmp/wheels",
          "--break-system-packages", "--no-cache-dir", "-r", "/tmp/wheels/requirements.txt"], "install torch into the rootfs")
    shutil.rmtree(wheels)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(rootfs / junk, ignore_errors=True)
    tar = workdir / "base.tar"
    _run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], "pack the rootfs")
    t0 = time.monotonic()
    with open(tar, "rb") as f:
        client.api.import_image(src=f, repository=BASE_IMAGE.split(":")[0], tag=BASE_IMAGE.split(":")[1],
                                changes=[f"LABEL {LABEL}={want}", "LABEL org.optirack.role=base",
                                         'CMD ["python3"]'])
    print(f"    docker import: {time.monotonic() - t0:.0f} s", flush=True)


def build_worker(client, base_id: str) -> None:
    t0 = time.monotonic()
    client.images.build(path=str(ROOT), dockerfile="containers/Dockerfile", tag=WORKER_IMAGE, rm=True,
                        buildargs={"BASE": BASE_IMAGE}, labels={LABEL: worker_inputs(base_id)})
    print(f"    docker build {WORKER_IMAGE}: {time.monotonic() - t0:.0f} s", flush=True)


def ensure_images(check_only: bool = False, force: bool = False) -> bool:
    """Build what is missing or stale; returns True if both images are up to date."""
    import docker

    client = docker.from_env()
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
        print(f"==> building {WORKER_IMAGE}", flush=True)
        build_worker(client, base.id)
    else:
        print(f"    {WORKER_IMAGE} up to date")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build-image", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if an image is missing or stale; build nothing")
    parser.add_argument("--force", action="store_true", help="rebuild both images even if they are up to date")
    args = parser.parse_args(argv)
    return 0 if ensure_images(check_only=args.check, force=args.force) else 1


if __name__ == "__main__":
    sys.exit(main())
