"""The sandbox image: built from the packaged sandbox_images/, tagged by the hash of its build context.

    tag = ensure_image()          # "rlcycle-sandbox:<16 hex>", built only when missing

The build context is `sandbox_images/Dockerfile` plus the executor (rlcycle/sandbox/
executor.py), read from the package (`rlcycle/data/sandbox_images/`, a copy of the checkout's
`sandbox_images/` made by scripts/gen_package_data.py), so a wheel builds the same image as a
checkout; its content hash, together with the requested base image, is the tag. So an
unchanged context is never rebuilt, and a changed executor can never run on a stale image.

The Dockerfile starts `FROM ${BASE}` (default python:3.12-slim). When that base cannot be
pulled (no registry reachable) and `offline_base` allows it, the base is made locally by
`sandbox_images/build_base_offline.sh` (debootstrap + docker import) and used instead.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlcycle import resources
from rlcycle.errors import RlcycleError
from rlcycle.sandbox.config import SandboxConfig

IMAGE_REPO = "rlcycle-sandbox"
BASE_REPO = "rlcycle-sandbox-base"
EXECUTOR = Path(__file__).resolve().parent / "executor.py"
OFFLINE_SCRIPT = "build_base_offline.sh"


def context_files() -> dict[str, bytes]:
    """The build context as {relative path: content}: the Dockerfile and the executor."""
    dockerfile = resources.sandbox_images() / "Dockerfile"
    if not dockerfile.is_file():
        raise RlcycleError(
            f"the sandbox Dockerfile is missing: {dockerfile} does not exist",
            hint="reinstall rlcycle (pip install --force-reinstall rlcycle); in a checkout run scripts/gen_package_data.py",
        )
    return {"Dockerfile": dockerfile.read_bytes(), "executor.py": EXECUTOR.read_bytes()}


def _digest(parts: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + hashlib.sha256(parts[name]).digest())
    return h.hexdigest()[:16]


def image_tag(config: SandboxConfig | None = None) -> str:
    """`rlcycle-sandbox:<hash>` of the build context and the requested base image."""
    config = config or SandboxConfig()
    files = context_files()
    return f"{IMAGE_REPO}:{_digest({**files, 'BASE': config.base_image.encode()})}"


def offline_base_tag() -> str:
    """Tag of the debootstrapped base: the hash of the script that makes it."""
    script = (resources.sandbox_images() / OFFLINE_SCRIPT).read_bytes()
    return f"{BASE_REPO}:{_digest({OFFLINE_SCRIPT: script})}"


def image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_image(
    client: Any = None,
    config: SandboxConfig | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> str:
    """Return the sandbox image tag, building it first when it does not exist.

    `client`: a docker client (default: from the environment). `config.image`, when set, is
    returned as it is (a user-supplied image must already exist). `force` rebuilds.
    Raises RlcycleError when neither the registry nor the offline path can make the base.
    """
    from rlcycle.sandbox.engine import docker_client

    config = config or SandboxConfig()
    client = client or docker_client()
    log = log or _quiet
    if config.image:
        if not image_exists(client, config.image):
            raise RlcycleError(
                f"sandbox image {config.image!r} (from --image or the config's `image`) does not exist",
                hint="build it, or unset `image` to use `rlcycle sandbox build`",
            )
        return config.image
    tag = image_tag(config)
    if image_exists(client, tag) and not force:
        return tag
    base = resolve_base(client, config, log)
    log(f"building {tag} FROM {base}")
    with tempfile.TemporaryDirectory(prefix="rlcycle-ctx-") as ctx:
        for name, data in context_files().items():
            (Path(ctx) / name).write_bytes(data)
        try:
            client.images.build(
                path=ctx,
                tag=tag,
                buildargs={"BASE": base},
                rm=True,
                forcerm=True,
                pull=False,
                labels={"rlcycle.image": "sandbox"},
            )
        except Exception as e:  # BuildError or APIError: both say what failed
            raise RlcycleError(
                f"building the sandbox image {tag} FROM {base} failed: {e}",
                hint="run `rlcycle sandbox build` to see the build log; "
                "--set offline_base=always builds without a registry",
            ) from None
    return tag


def resolve_base(client: Any, config: SandboxConfig, log: Callable[[str], None]) -> str:
    """The image to build FROM: base_image if present or pullable, else the offline base."""
    if config.offline_base != "always":
        if image_exists(client, config.base_image):
            return config.base_image
        problem = _try_pull(client, config.base_image)
        if problem is None:
            return config.base_image
        if config.offline_base == "never":
            raise RlcycleError(
                f"cannot pull the sandbox base image {config.base_image}: {problem}",
                hint="--set offline_base=auto builds a base locally with debootstrap",
            )
        log(f"cannot pull {config.base_image} ({problem}); building the base offline")
    tag = offline_base_tag()
    if not image_exists(client, tag):
        build_offline_base(tag, log)
    return tag


def _try_pull(client: Any, image: str) -> str | None:
    """Pull `image`; None on success, else a one-line reason. Bounded in time."""
    # The client's own timeout (120 s in engine.docker_client) bounds a hanging registry.
    try:
        repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        client.api.pull(repo, tag=tag or "latest")
        return None
    except Exception as e:  # registry unreachable, DNS, auth, timeout
        return str(e).splitlines()[0][:200]


def build_offline_base(tag: str, log: Callable[[str], None]) -> None:
    """Run build_base_offline.sh (debootstrap + docker import) to make `tag`."""
    script = resources.sandbox_images() / OFFLINE_SCRIPT
    if shutil.which("docker") is None:
        raise RlcycleError(
            "building the offline sandbox base needs the `docker` command line",
            hint="install docker.io (bash scripts/ensure_docker.sh does it as root)",
        )
    log(f"building the offline base {tag} with {script} (first time: about a minute)")
    proc = subprocess.run(["bash", str(script), tag], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise RlcycleError(
            f"the offline base build ({script}) failed with exit {proc.returncode}:\n{tail}",
            hint=f"run `bash {script}` as root to see the whole log",
        )


def _quiet(message: str) -> None:
    pass
