"""Checkpoint ids that cover every file that changes the model, manifests, and the two checks.

Real tiny transformers checkpoints; the CLI (`init-model`, `deploy`, `rollback`, `registry
add/verify`) run through `rlcycle.cli.run`; damage done in place as a disk or an editor would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_deploy import make_ckpt

from rlcycle.cli.options import registry_dir
from rlcycle.policy import manifest as M
from rlcycle.policy.registry import CheckpointChanged, Registry, checkpoint_id, verify_checkpoint

SAMPLE_TOKENIZER = Path(__file__).resolve().parent.parent / "sample_data" / "tokenizer"


def tiny_ckpt(path: Path, seed: int) -> Path:
    """A real (tiny, random) Qwen2 checkpoint with a tokenizer, as `save_pretrained` writes it."""
    from transformers import AutoTokenizer

    make_ckpt(path, seed)
    AutoTokenizer.from_pretrained(SAMPLE_TOKENIZER).save_pretrained(path)
    return path


@pytest.fixture
def ckpts(tmp_path):
    return [tiny_ckpt(tmp_path / f"ckpt{i}", i) for i in range(2)]


def verdict(tmp_path: Path) -> Path:
    p = tmp_path / "verdict.json"
    p.write_text(json.dumps({"decision": "accept", "gates": []}))
    return p


def zero_64_bytes(path: Path, at: int = 4096) -> None:
    """Overwrite 64 bytes in place (same size; only the mtime tells the cheap check to look)."""
    with open(path, "r+b") as f:
        f.seek(at)
        assert f.read(64) != b"\0" * 64
        f.seek(at)
        f.write(b"\0" * 64)


def registry_copy(cid: str) -> Path:
    return Registry(registry_dir()).ckpts / cid


# --- what the id covers -----------------------------------------------------------------------


def test_init_model_id_covers_the_config_not_only_the_weights(cli, tmp_path):
    """`--set max_position_embeddings=65536` draws the same weights; it must not be the same id."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(["init-model", "-o", a, "--seed", "0"]).exit_code == 0
    r = cli(["init-model", "-o", b, "--seed", "0", "--set", "max_position_embeddings=65536", "--json"])
    assert r.exit_code == 0, r.output
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    ida, idb = checkpoint_id(a), checkpoint_id(b)
    assert M.ID_RE.fullmatch(ida) and ida != idb and json.loads(r.stdout)["checkpoint_id"] == idb
    # the id is what rlcycle.json, the manifest and a fresh hash all say, every time
    for d, cid in ((a, ida), (b, idb)):
        assert json.loads((d / "rlcycle.json").read_text())["id"] == cid == M.read_manifest(d).id
        assert M.content_id(d) == M.content_id(d) == cid
        assert verify_checkpoint(d, full=True).id == cid
    # an independent reader: sha256sum over the listed files reproduces it (module docstring)
    listing = subprocess.run(
        "find . -type f ! -path ./rlcycle.json ! -path ./rlcycle.manifest.json ! -path ./train_metrics.arrow "
        "| cut -c3- | LC_ALL=C sort | xargs sha256sum | sha256sum",
        shell=True,
        cwd=a,
        capture_output=True,
        text=True,
        check=True,
    )
    assert ida == "sha256:" + listing.stdout.split()[0]
    names = set(M.read_manifest(a).files)
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not names & M.METADATA


def test_tokenizer_and_chat_template_change_the_id(ckpts, tmp_path):
    base = M.content_id(ckpts[0])
    edits = {
        "tokenizer.json": lambda d: d.replace('"<|im_end|>"', '"<|im_stop|>"', 1),
        "tokenizer_config.json": lambda d: d.replace("<|im_start|>", "<|im_begin|>", 1),  # the chat template
    }
    for name, edit in edits.items():
        other = shutil.copytree(ckpts[0], tmp_path / f"edited-{name}")
        text = (other / name).read_text()
        assert edit(text) != text
        (other / name).write_text(edit(text))
        assert M.content_id(other) != base, name
    other = shutil.copytree(ckpts[0], tmp_path / "template")
    (other / "chat_template.jinja").write_text("{{ messages }}")  # a separate template file counts too
    assert M.content_id(other) != base
    meta = shutil.copytree(ckpts[0], tmp_path / "meta")
    (meta / "rlcycle.json").write_text('{"note": "lineage only"}')  # rlcycle's metadata does not
    (meta / "train_metrics.arrow").write_bytes(b"metrics")
    assert M.content_id(meta) == base


# --- the checks -------------------------------------------------------------------------------


def test_untouched_checkpoint_verifies_and_cheap_rehashes_only_what_moved(cli, ckpts, tmp_path):
    r = cli(["registry", "add", ckpts[0], "--alias", "production"])
    assert r.exit_code == 0, r.output
    cid = r.stdout.strip()
    copy = registry_copy(cid)
    assert cid == M.content_id(ckpts[0]) == checkpoint_id(copy) == M.read_manifest(copy).id
    cheap = verify_checkpoint(copy)
    assert (cheap.id, cheap.recorded, cheap.rehashed) == (cid, True, 0) and cheap.files >= 5
    full = verify_checkpoint(copy, full=True)
    assert full.rehashed == full.files == cheap.files and full.bytes == cheap.bytes
    os.utime(copy / "config.json")  # a new mtime, the same bytes: re-hashed, and fine
    assert verify_checkpoint(copy).rehashed == 1
    r = cli(["registry", "verify"])
    assert r.exit_code == 0 and r.stdout.startswith(f"ok       {cid}  (production; ")
    r = cli(["registry", "verify", "production", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["ok"] and doc["checkpoints"][0]["id"] == cid
    # `cp -r` of a made checkpoint: every mtime moved, so every file is re-hashed (and matches);
    # its registry copy records the mtimes it has, so opening that copy re-hashes nothing
    M.write_manifest(ckpts[1])
    copied = shutil.copytree(ckpts[1], tmp_path / "cp", copy_function=shutil.copy)
    v = verify_checkpoint(copied)
    assert v.rehashed == v.files and v.id == checkpoint_id(ckpts[1])
    other = cli(["registry", "add", copied]).stdout.strip()
    assert other == v.id and verify_checkpoint(registry_copy(other)).rehashed == 0


def test_zeroed_weights_are_refused_by_cheap_verify_registry_verify_and_rollback(cli, ckpts, tmp_path):
    v = verdict(tmp_path)
    for c in ckpts:
        assert cli(["deploy", c, "--verdict", v]).exit_code == 0
    reg = Registry(registry_dir())
    old, new = checkpoint_id(ckpts[0]), checkpoint_id(ckpts[1])
    assert reg.aliases() == {"production": new, "previous": old}
    zero_64_bytes(registry_copy(old) / "model.safetensors")

    with pytest.raises(CheckpointChanged, match=r"model\.safetensors: changed \(sha256 ") as e:
        verify_checkpoint(registry_copy(old))  # cheap: the mtime moved, so it re-hashed
    assert e.value.exit_code == 2 and old in e.value.message and "registry verify" in e.value.hint

    r = cli(["registry", "verify"])
    assert r.exit_code == 1
    lines = {line.split()[1]: line for line in r.stdout.splitlines()}
    assert lines[old].startswith("CHANGED") and "model.safetensors: changed" in lines[old]
    assert lines[new].startswith("ok")
    doc = json.loads(cli(["registry", "verify", "previous", "--json"]).stdout)
    assert not doc["ok"] and doc["checkpoints"][0]["problems"][0].startswith("model.safetensors: changed")

    history = reg.history().num_rows
    r = cli(["rollback"])
    assert r.exit_code == 2 and "model.safetensors: changed" in r.error
    assert Registry(registry_dir()).aliases() == {"production": new, "previous": old}  # nothing moved
    assert Registry(registry_dir()).history().num_rows == history

    # the hint's fix: adding the intact source again replaces the damaged copy
    assert cli(["registry", "add", ckpts[0]]).exit_code == 0
    assert cli(["registry", "verify"]).exit_code == 0 and cli(["rollback"]).exit_code == 0


def test_zeroed_weights_are_refused_by_deploy(cli, ckpts, tmp_path):
    v = verdict(tmp_path)
    cid = cli(["registry", "add", ckpts[0]]).stdout.strip()
    zero_64_bytes(registry_copy(cid) / "model.safetensors")
    r = cli(["deploy", registry_copy(cid), "--verdict", v])  # what would be served is damaged
    assert r.exit_code == 2 and "model.safetensors: changed" in r.error and cid in r.error
    # a source with a manifest (as train writes), damaged after it was made: nothing is copied
    M.write_manifest(ckpts[1])
    zero_64_bytes(ckpts[1] / "model.safetensors")
    r = cli(["deploy", ckpts[1], "--verdict", v])
    assert r.exit_code == 2 and "model.safetensors: changed" in r.error
    reg = Registry(registry_dir())
    assert reg.aliases() == {} and reg.history().num_rows == 0
    assert [c["id"] for c in reg.checkpoints()] == [cid]


def test_missing_extra_and_resized_files_are_named(cli, ckpts):
    cid = cli(["registry", "add", ckpts[0], "--alias", "production"]).stdout.strip()
    copy = registry_copy(cid)
    (copy / "tokenizer.json").unlink()
    shutil.copy2(copy / "model.safetensors", copy / "model-extra.safetensors")
    with open(copy / "config.json", "a") as f:
        f.write("\n")
    r = cli(["registry", "verify", "production", "--json"])
    assert r.exit_code == 1
    problems = json.loads(r.stdout)["checkpoints"][0]["problems"]
    assert "tokenizer.json: missing" in problems
    assert "model-extra.safetensors: unexpected file (not in the manifest)" in problems
    assert any(p.startswith("config.json: changed (size ") for p in problems)
    with pytest.raises(CheckpointChanged) as e:
        verify_checkpoint(copy)
    assert e.value.problems == problems
    assert cli(["registry", "verify", "no-such-alias"]).exit_code == 2
    # a damaged manifest is one more changed checkpoint, reported beside the others
    other = cli(["registry", "add", ckpts[1]]).stdout.strip()
    (registry_copy(other) / M.MANIFEST).write_text("{not json")
    r = cli(["registry", "verify"])
    assert r.exit_code == 1 and len(r.stdout.splitlines()) == 2
    assert f"CHANGED  {other}" in r.stdout and "rlcycle.manifest.json: not a valid manifest" in r.stdout


def test_the_vllm_hook_refuses_a_changed_checkpoint_before_touching_the_server(cli, ckpts):
    cid = cli(["registry", "add", ckpts[0]]).stdout.strip()
    copy = registry_copy(cid)
    args = ["deploy-vllm", "--url", "http://127.0.0.1:9", "--checkpoint", str(copy), "--id", cid]
    r = cli(args)  # intact: past the check, refused as a full fine-tune (nothing listens on :9)
    assert r.exit_code == 2 and "no LoRA adapter" in r.error
    zero_64_bytes(copy / "model.safetensors")
    r = cli(args)
    assert r.exit_code == 2 and "model.safetensors: changed" in r.error


# --- checkpoints made before manifests --------------------------------------------------------


def test_a_checkpoint_made_before_manifests_keeps_its_id(cli, ckpts, tmp_path):
    """Old train/init-model output: rlcycle.json's id was the sha256 of model.safetensors."""
    legacy = ckpts[0]
    old_id = "sha256:" + M.digest.file_sha256(legacy / "model.safetensors")
    (legacy / "rlcycle.json").write_text(json.dumps({"id": old_id, "parent": None}))
    v = verify_checkpoint(legacy)
    assert (v.id, v.recorded, v.rehashed) == (old_id, False, v.files) and checkpoint_id(legacy) == old_id
    assert cli(["registry", "add", legacy, "--alias", "production"]).stdout.strip() == old_id
    copy = registry_copy(old_id)
    m = M.read_manifest(copy)  # the registry's copy got a manifest: from now on every file is guarded
    assert m.id == old_id and m.content_id == M.content_id(legacy) != old_id
    assert verify_checkpoint(copy, full=True).recorded
    assert cli(["registry", "verify"]).exit_code == 0
    (copy / "tokenizer.json").write_text("{}")  # not in the old id, but in the manifest
    assert "tokenizer.json: changed" in cli(["registry", "verify"]).stdout
    zero_64_bytes(legacy / "model.safetensors")  # no manifest: caught, though not by file name
    with pytest.raises(CheckpointChanged, match="cannot be named"):
        verify_checkpoint(legacy)


def test_an_old_registry_copy_without_rlcycle_json_verifies_by_its_name(ckpts):
    """Registries stored a foreign checkpoint under the sha256 of all its files (names, bytes)."""
    reg = Registry(registry_dir())
    old_id = "sha256:" + M.digest.tree_sha256(ckpts[1])
    shutil.copytree(ckpts[1], reg.ckpts / old_id)
    assert verify_checkpoint(reg.ckpts / old_id, full=True).id == old_id
    [check] = reg.verify()
    assert check.ok and not check.recorded
    zero_64_bytes(reg.ckpts / old_id / "model.safetensors")
    [check] = reg.verify()
    assert not check.ok and "its directory name says id" in check.problems[0]
