"""Checkpoint reading and strict loading: errors name the keys, files are never unpickled."""
import pytest
import torch

import vae
from tests.reference import REPO, tiny_checkpoint


@pytest.fixture(scope="module")
def seedvr2_state():
    sd, _ = vae.read_checkpoint(tiny_checkpoint("seedvr2"))
    return sd


def load(sd):
    return vae.load(sd, config={"norm_num_groups": 8})


def test_missing_key_is_named(seedvr2_state):
    sd = dict(seedvr2_state)
    del sd["decoder.up_blocks.1.resnets.2.conv2.bias"]
    with pytest.raises(vae.CheckpointError, match=r"missing: decoder\.up_blocks\.1\.resnets\.2\.conv2\.bias"):
        load(sd)


def test_unexpected_key_is_named(seedvr2_state):
    sd = dict(seedvr2_state, **{"decoder.extra_block.weight": torch.zeros(3)})
    with pytest.raises(vae.CheckpointError, match=r"unexpected: decoder\.extra_block\.weight"):
        load(sd)


def test_wrong_shape_is_named(seedvr2_state):
    sd = dict(seedvr2_state)
    sd["encoder.conv_out.bias"] = torch.zeros(31)
    with pytest.raises(vae.CheckpointError, match=r"wrong shape: encoder\.conv_out\.bias \(31,\) \(expected \(32,\)\)"):
        load(sd)


def test_unknown_checkpoint_names_families_and_probe_keys():
    sd = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(4, 4, 3, 3)}
    with pytest.raises(vae.CheckpointError) as err:
        vae.load(sd)
    message = str(err.value)
    for cls in vae.loading.FAMILIES:
        assert f"{cls.family}: missing" in message
        assert cls.probe_keys[0] in message


def test_group_count_that_does_not_divide_channels_says_what_to_pass(seedvr2_state):
    with pytest.raises(ValueError, match="norm_num_groups"):
        vae.load(seedvr2_state)  # released default 32 does not divide the tiny model's 16 channels


def test_config_travels_in_safetensors_metadata(tmp_path, seedvr2_state):
    path = tmp_path / "tiny.safetensors"
    vae.save_checkpoint(seedvr2_state, path, config={"norm_num_groups": 8})
    assert vae.load(path).config.norm_num_groups == 8


def test_pth_state_dict_loads_with_weights_only(tmp_path, seedvr2_state):
    path = tmp_path / "ema_vae.pth"
    torch.save({"state_dict": {f"vae.{k}": v for k, v in seedvr2_state.items()}}, path)
    assert load(vae.read_checkpoint(path)[0]).family == "seedvr2"


class _Payload:
    """Pickles to a call of `exec` that would write a marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_malicious_pickle_never_runs(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "payload": _Payload(marker)}, path)
    with pytest.raises(vae.CheckpointError, match="never unpickles"):
        vae.read_checkpoint(path)
    assert not marker.exists()


def test_truncated_safetensors_is_reported(tmp_path):
    data = tiny_checkpoint("seedvr2").read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(vae.CheckpointError, match="truncated or corrupt"):
        vae.read_checkpoint(path)


def test_vae_library_imports_without_comfyui():
    """`import vae` needs only torch + safetensors: no ComfyUI module may be imported by it."""
    import subprocess
    import sys

    code = "import sys, vae; bad = [m for m in sys.modules if m.split('.')[0] in ('comfy', 'comfy_api', 'folder_paths', 'nodes')]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
