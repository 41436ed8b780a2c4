"""LoaderConfig: fields, JSON with inherits, XML <training>, and every error."""

import json
import logging

import pytest

from sftdata.errors import ConfigError
from sftdata.order.config import LoaderConfig
from tests.helpers.paths import ROOT


def write(p, obj):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj) if not isinstance(obj, str) else obj)
    return p


def test_defaults_are_seed_001s():
    c = LoaderConfig()
    assert (c.batch_sampling_mode, c.epoch_seed, c.epoch_shuffle, c.epoch_drop_last, c.pad_token_id,
            c.episode_min_tokens, c.use_loss_mask, c.dataset_mode) == (None, 1337, True, True, None, 2, False, None)


def test_from_dict_keeps_training_keys_in_extra():
    c = LoaderConfig.from_dict({"batch_size": 4, "block_size": 64, "n_layer": 12, "learning_rate": 3e-4,
                                "max_iters": 5000, "warmup_iters": 100, "use_loss_mask": True})
    assert (c.batch_size, c.block_size, c.use_loss_mask) == (4, 64, True)
    assert c.extra == {"n_layer": 12, "learning_rate": 3e-4, "max_iters": 5000, "warmup_iters": 100}
    assert c.to_dict()["n_layer"] == 12 and c.to_dict()["batch_size"] == 4


def test_a_typo_of_a_loader_key_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="sftdata.loader"):
        c = LoaderConfig.from_dict({"epoch_sed": 42, "n_embd": 768})
    assert c.epoch_seed == 1337 and c.extra == {"epoch_sed": 42, "n_embd": 768}
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "'epoch_sed'" in msgs[0] and "did you mean 'epoch_seed'" in msgs[0]


@pytest.mark.parametrize("key,value,match", [
    ("dataset_mode", "sft", "dataset_mode 'sft' is not valid; choose one of: token_stream, sft_episode"),
    ("batch_sampling_mode", "shuffle", "choose one of: epoch, random"),
    ("token_dtype", "int8", "choose one of: uint16, uint32"),
    ("batch_size", 0, "batch_size must be an integer >= 1, got 0"),
    ("block_size", "512", "block_size must be an integer >= 1, got '512'"),
    ("episode_min_tokens", True, "episode_min_tokens must be an integer"),
    ("epoch_seed", -3, r"epoch_seed must be an integer in 0..4294967295"),
    ("epoch_seed", 2**32, r"epoch_seed must be an integer in 0..4294967295"),
    ("pad_token_id", -1, "pad_token_id must be null or an integer >= 0"),
    ("epoch_shuffle", "yes", "epoch_shuffle must be true or false, got 'yes'"),
    ("use_loss_mask", 1, "use_loss_mask must be true or false"),
    ("audit_dir", 5, "audit_dir must be a folder path"),
])
def test_invalid_values(key, value, match):
    with pytest.raises(ConfigError, match=match):
        LoaderConfig.from_dict({key: value})


def test_not_a_dict():
    with pytest.raises(ConfigError, match="must be a JSON object, got list"):
        LoaderConfig.from_dict([1, 2])


def test_json_inherits_chain_relative_to_the_file(tmp_path):
    write(tmp_path / "base" / "model.json", {"block_size": 1024, "n_layer": 12, "epoch_seed": 1})
    write(tmp_path / "sft1" / "150M.json", {"inherits": "../base/model.json", "batch_size": 16, "epoch_seed": 2})
    exp = write(tmp_path / "sft1" / "my_experiment.json",
                {"inherits": "150M.json", "epoch_seed": 42, "batch_sampling_mode": "epoch"})
    c = LoaderConfig.from_file(exp)
    assert (c.block_size, c.batch_size, c.epoch_seed, c.batch_sampling_mode) == (1024, 16, 42, "epoch")
    assert c.extra == {"n_layer": 12}
    assert c.source == str(exp)


def test_json_inherits_falls_back_to_the_current_folder(tmp_path, monkeypatch):
    # seed 001's example: "inherits": "configs/sft1/150M.json" inside configs/sft1/
    write(tmp_path / "configs" / "sft1" / "150M.json", {"batch_size": 3})
    exp = write(tmp_path / "configs" / "sft1" / "exp.json", {"inherits": "configs/sft1/150M.json"})
    monkeypatch.chdir(tmp_path)
    assert LoaderConfig.from_file("configs/sft1/exp.json").batch_size == 3
    assert LoaderConfig.from_file(exp).batch_size == 3


def test_json_inherits_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.json", {"inherits": "b.json"})
    write(tmp_path / "b.json", {"inherits": "c.json"})
    write(tmp_path / "c.json", {"inherits": "a.json"})
    with pytest.raises(ConfigError, match=r"cycle: .*a\.json -> .*b\.json -> .*c\.json -> .*a\.json"):
        LoaderConfig.from_file(tmp_path / "a.json")
    write(tmp_path / "self.json", {"inherits": "self.json"})
    with pytest.raises(ConfigError, match="cycle"):
        LoaderConfig.from_file(tmp_path / "self.json")


def test_json_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        LoaderConfig.from_file(tmp_path / "missing.json")
    write(tmp_path / "orphan.json", {"inherits": "nope.json"})
    with pytest.raises(ConfigError, match=r"inherits 'nope.json', but neither .*nope.json \(relative to the config\)"):
        LoaderConfig.from_file(tmp_path / "orphan.json")
    write(tmp_path / "bad.json", '{"batch_size": 4,\n "block_size": }')
    with pytest.raises(ConfigError, match=r"bad.json: line 2 column 16: invalid JSON"):
        LoaderConfig.from_file(tmp_path / "bad.json")
    write(tmp_path / "list.json", "[1]")
    with pytest.raises(ConfigError, match="must be a JSON object, got a list"):
        LoaderConfig.from_file(tmp_path / "list.json")
    write(tmp_path / "inh.json", {"inherits": 5})
    with pytest.raises(ConfigError, match="'inherits' must be a path"):
        LoaderConfig.from_file(tmp_path / "inh.json")
    write(tmp_path / "val.json", {"dataset_mode": "episodes"})
    with pytest.raises(ConfigError, match=r"dataset_mode 'episodes' is not valid \(in .*val.json\); choose one of"):
        LoaderConfig.from_file(tmp_path / "val.json")


SEED_000_XML = """<?xml version="1.0"?>
<training>
  <dataset_mode>sft_episode</dataset_mode> <!-- token_stream | sft_episode -->
  <batch_sampling_mode>random</batch_sampling_mode>
  <epoch_shuffle>true</epoch_shuffle>
  <epoch_drop_last>false</epoch_drop_last>
  <epoch_seed>1337</epoch_seed>
  <pad_token_id>50256</pad_token_id>
  <episode_min_tokens>2</episode_min_tokens>
  <use_loss_mask>TRUE</use_loss_mask>
  <batch_size>4</batch_size>
  <block_size>128</block_size>
</training>
"""


def test_xml_training_section_is_typed(tmp_path):
    c = LoaderConfig.from_file(write(tmp_path / "train.xml", SEED_000_XML))
    assert (c.dataset_mode, c.batch_sampling_mode, c.epoch_shuffle, c.epoch_drop_last, c.epoch_seed,
            c.pad_token_id, c.episode_min_tokens, c.use_loss_mask, c.batch_size, c.block_size) == (
        "sft_episode", "random", True, False, 1337, 50256, 2, True, 4, 128)


def test_xml_nested_training_and_null_pad(tmp_path):
    xml = "<config><model><n_layer>12</n_layer></model><training><pad_token_id></pad_token_id>" \
          "<epoch_seed> 7 </epoch_seed></training></config>"
    c = LoaderConfig.from_file(write(tmp_path / "c.cfg", xml))  # detected by content, not suffix
    assert c.pad_token_id is None and c.epoch_seed == 7


@pytest.mark.parametrize("body,match", [
    ("<epoch_sed>1</epoch_sed>", r"unknown tag <epoch_sed> in <training> \(did you mean <epoch_seed>\?\)"),
    ("<learning_rate>1</learning_rate>", r"unknown tag <learning_rate> in <training>; known tags: batch_size"),
    ("<epoch_shuffle>maybe</epoch_shuffle>", r"<epoch_shuffle>maybe</epoch_shuffle> is not a boolean"),
    ("<batch_size>8.5</batch_size>", r"<batch_size>8.5</batch_size> is not an integer"),
    ("<batch_size>0</batch_size>", r"batch_size must be an integer >= 1, got 0"),
    ("<dataset_mode>tokens</dataset_mode>", r"choose one of: token_stream, sft_episode"),
    ("<epoch_seed>1</epoch_seed><epoch_seed>2</epoch_seed>", r"<epoch_seed> is given twice"),
    ("<epoch_seed><v>1</v></epoch_seed>", r"<epoch_seed> must hold a plain value"),
])
def test_xml_errors(tmp_path, body, match):
    with pytest.raises(ConfigError, match=match):
        LoaderConfig.from_file(write(tmp_path / "t.xml", f"<training>{body}</training>"))


def test_xml_without_training_or_broken(tmp_path):
    with pytest.raises(ConfigError, match="no <training> element"):
        LoaderConfig.from_file(write(tmp_path / "a.xml", "<config><model/></config>"))
    with pytest.raises(ConfigError, match="invalid XML"):
        LoaderConfig.from_file(write(tmp_path / "b.xml", "<training><batch_size>4</training>"))


def test_xml_entities_are_refused(tmp_path):
    laughs = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
]>
<training><dataset_mode>&lol2;</dataset_mode></training>"""
    with pytest.raises(ConfigError, match=r"line 2: <!DOCTYPE ...> declarations are not allowed"):
        LoaderConfig.from_file(write(tmp_path / "lol.xml", laughs))
    external = '<!ENTITY xxe SYSTEM "file:///etc/passwd"><training/>'  # outside a DOCTYPE: not even XML
    with pytest.raises(ConfigError, match=r"xxe.xml: invalid XML \(syntax error: line 1, column 0\)$"):
        LoaderConfig.from_file(write(tmp_path / "xxe.xml", external))


def test_example_configs_load():

    ex = ROOT / "configs" / "examples"
    c = LoaderConfig.from_file(ex / "my_experiment.json")
    assert (c.epoch_seed, c.block_size, c.batch_size, c.use_loss_mask, c.epoch_drop_last, c.audit_dir) == (
        42, 2048, 8, True, False, "logs/audit")
    assert c.extra == {"n_layer": 12, "n_head": 12, "n_embd": 768, "learning_rate": 0.0003, "max_iters": 5000,
                       "warmup_iters": 200}
    x = LoaderConfig.from_file(ex / "training.xml")
    assert (x.dataset_mode, x.pad_token_id, x.use_loss_mask, x.block_size) == ("sft_episode", None, True, 1024)


def test_xml_accepts_the_training_scripts_declared_keys_typed(tmp_path):
    p = tmp_path / "t.xml"
    p.write_text("<training><batch_size>3</batch_size><learning_rate>3e-4</learning_rate>"
                 "<tie_weights>false</tie_weights><n_layer>2</n_layer></training>")
    keys = {"learning_rate": float, "tie_weights": bool, "n_layer": int}
    c = LoaderConfig.from_file(p, extra_keys=keys)
    assert c.batch_size == 3
    assert c.extra == {"learning_rate": 3e-4, "tie_weights": False, "n_layer": 2}
    with pytest.raises(ConfigError, match="unknown tag <learning_rate>"):
        LoaderConfig.from_file(p)
    p.write_text("<training><learning_rate>fast</learning_rate></training>")
    with pytest.raises(ConfigError, match="<learning_rate>fast</learning_rate> is not a number"):
        LoaderConfig.from_file(p, extra_keys=keys)
