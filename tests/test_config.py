"""rlcycle.config.resolve on nested (dataclass-typed) fields: tables and dotted keys at any
depth, key-by-key defaults, every problem of every level at once with its dotted path."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from rlcycle.config import cfg, check_range, resolve, validate_all
from rlcycle.errors import InputError


@dataclass
class Lora:
    r: int = cfg(0, help="rank")
    alpha: float | None = cfg(None, help="scale")
    targets: list[str] = cfg(["all-linear"], help="modules")

    def validate(self) -> list[str]:
        p: list[str] = []
        check_range(p, self, "r", ge=0)
        return p


@dataclass
class Train:
    lr: float = cfg(1e-6, help="learning rate")
    lora: Lora = cfg(Lora(), help="LoRA")
    meta: dict[str, str] = cfg({}, help="a plain table")

    def validate(self) -> list[str]:
        p: list[str] = []
        check_range(p, self, "lr", gt=0)
        return p


@dataclass
class Cycle:
    name: str = cfg("c", help="name")
    # The outer default differs from the class default: it is the base of a partial table.
    train: Train = cfg(Train(lr=1e-5), help="train table")
    maybe: Lora | None = cfg(None, help="an optional nested config")


def _err(**kw) -> str:
    with pytest.raises(InputError) as e:
        resolve(Cycle, **kw)
    return e.value.message + "\nHint: " + (e.value.hint or "")


def test_defaults_are_the_nested_defaults():
    c = resolve(Cycle)
    assert c == Cycle() and c.train.lr == 1e-5 and c.train.lora == Lora()
    assert c.train.lora is not Cycle().train.lora  # each object gets its own copy


def test_a_table_overrides_only_the_keys_it_names(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[cycle.train.lora]\nr = 8\n[cycle.train]\nmeta = {a = "b"}\n')
    c = resolve(Cycle, f, section="cycle")
    assert c.train.lr == 1e-5  # the outer field's default, not Train's own 1e-6
    assert c.train.lora == Lora(r=8)
    assert c.train.meta == {"a": "b"}


def test_layers_merge_key_by_key_at_every_depth(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nlr = 0.5\n[train.lora]\nalpha = 4\n")
    c = resolve(
        Cycle,
        f,
        sets=["train.lora.r=16", "train.lora.targets=q_proj,v_proj", "maybe={r = 2}"],
        flags={"train.lora.alpha": 32.0, "name": None},
        data={"train": {"lora": {"r": 4, "alpha": 1}}},
    )
    assert c.train.lr == 0.5
    assert c.train.lora == Lora(r=16, alpha=32.0, targets=["q_proj", "v_proj"])
    assert isinstance(c.train.lora.alpha, float)
    assert c.maybe == Lora(r=2)


def test_dotted_keys_in_data_and_instances():
    c = resolve(Cycle, data={"train.lora.r": 3, "maybe": Lora(r=5)})
    assert c.train.lora.r == 3 and c.maybe == Lora(r=5)


def test_every_problem_of_every_level_at_once_with_its_path():
    msg = _err(
        sets=["train.lora.r=x", "train.lora.rr=1", "train.lrr=1", "nmae=z", "train.lr.x=1"],
        data={"train": {"lora": 7}},
    )
    assert "6 problem(s) in the Cycle" in msg
    assert "config: train.lora=7: expected a table of Lora keys" in msg
    assert "--set: train.lora.r='x': " in msg
    assert "--set: unknown key 'train.lora.rr' (did you mean 'train.lora.r'?)" in msg
    assert "--set: unknown key 'train.lrr' (did you mean 'train.lr'?)" in msg
    assert "--set: unknown key 'nmae' (did you mean 'name'?)" in msg
    assert "'train.lr' is not a table" in msg
    # The hint names the valid keys of each level where an unknown key was given.
    assert "valid keys of train.lora: train.lora.alpha, train.lora.r, train.lora.targets" in msg
    assert "valid keys: maybe, name, train" in msg


def test_type_errors_name_the_dotted_path(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[train.lora]\nr = "x"\n')
    assert "config file " + str(f) + ": train.lora.r='x': expected an integer" in _err(file=f)


def test_validate_runs_at_every_level_and_prefixes_problems():
    msg = _err(sets=["train.lora.r=-1", "train.lr=0", "maybe.r=-2"])
    assert "3 problem(s) in the Cycle" in msg
    assert "train.lora.r=-1: must be >= 0" in msg
    assert "train.lr=0.0: must be > 0" in msg
    assert "maybe.r=-2: must be >= 0" in msg
    assert validate_all(Cycle(train=Train(lora=Lora(r=-1)))) == ["train.lora.r=-1: must be >= 0"]


def test_a_key_of_a_nested_table_is_suggested_by_its_dotted_name():
    msg = _err(sets=["train.r=4"])
    assert "--set: unknown key 'train.r' (did you mean 'train.lora.r'?)" in msg


def test_asdict_of_a_nested_config_is_json():
    c = resolve(Cycle, sets=["train.lora.r=2", "maybe.r=1"])
    d = json.loads(json.dumps(dataclasses.asdict(c)))
    assert d["train"]["lora"] == {"r": 2, "alpha": None, "targets": ["all-linear"]}
    assert d["maybe"]["r"] == 1


def test_a_key_of_a_nested_config_given_flat_names_its_dotted_key():
    msg = _err(sets=["targets=a,b", "lr=1"])
    assert "--set: unknown key 'targets' (did you mean 'train.lora.targets'?)" in msg
    assert "--set: unknown key 'lr' (did you mean 'train.lr'?)" in msg
