"""prepare-chat of image records on Ray: the partition tasks stage each episode's media spans
and the shard tasks write each shard's media table, byte for byte as one process does."""

from __future__ import annotations

from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store.format import MEDIA_FILE
from tests.helpers.data import write_jsonl
from tests.helpers.vision import IMAGES, model_folder, write_images


def test_image_records_on_ray_are_the_bytes_of_one_process(ray_cluster, tmp_path):
    folder = model_folder(tmp_path / "model", "qwen2_5_vl")
    write_images(tmp_path / "data")
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "image": name},
                                                          {"type": "text", "text": f"Picture {k}?"}]},
                             {"role": "assistant", "content": f"Number {k}."}]} for k, (name, *_) in enumerate(IMAGES)]
    src = write_jsonl(tmp_path / "data" / "in.jsonl", records * 3)
    opts = PrepareOptions(tokenizer=str(folder), val_split=0.25, seed=2, shard_tokens=900)
    prepare([src], tmp_path / "one", opts)
    prepare([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=700))

    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name != "dataset_metadata.json"}

    one = files(tmp_path / "one")
    assert one == files(tmp_path / "ray")
    shards = [k for k in one if k.endswith("/tokens.bin")]
    assert len(shards) >= 3 and sum(1 for k in one if k.endswith(MEDIA_FILE)) == len(shards)
