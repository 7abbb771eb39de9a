"""Checkpoint reading, family detection and strict loading.

Checkpoints are read with safetensors, or with `torch.load(weights_only=True)` for .pth/.ckpt files,
so no code stored in a checkpoint ever runs. The family is detected from the key names alone; the
model is built on the meta device from a config derived from the tensor shapes (plus overrides from
the caller or from the file's `streamvae_config` metadata) and the weights are then assigned
strictly: a missing, unexpected or mis-shaped key is an error that names it.
"""
import dataclasses
import inspect
import json
import math
import os
import pickle
import re
from collections.abc import Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .families import SPECS
from .model.video_vae import LayoutError, VideoVAE

# The registry's order (`families.SPECS`), which is detection's.
FAMILIES: list[type[VideoVAE]] = [spec.vae_class for spec in SPECS]

CONFIG_METADATA_KEY = "streamvae_config"
SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
PICKLE_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")
# Wrappers some trainers put around a state dict, and key prefixes some exporters add.
_NESTED_KEYS = ("state_dict", "model", "module", "ema")
_KEY_PREFIXES = ("first_stage_model.", "vae.", "model.", "module.")


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
                       "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32,
                       "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why and what to do."""


def read_checkpoint(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and safetensors metadata of a checkpoint file, on the CPU, in their stored dtype, each in
    memory of its own (never a view of the file mapped into memory: a file replaced or cut while they
    are in use would change them, or crash the process). Pickles (.pth/.ckpt/...) are scanned for code
    first and read with `weights_only=True`."""
    path = _existing(path)
    if path.lower().endswith(PICKLE_SUFFIXES):
        return _read_pickle(path), {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:  # the format checked, the keys and metadata
            keys, metadata = vae_part(list(f.keys())), dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as err:
        if path.lower().endswith(SAFETENSORS_SUFFIXES):
            raise _unreadable(path, err) from err
        return _read_pickle(path), {}
    return _read_safetensors(path, keys), metadata


def _read_safetensors(path: str, keys: list[str]) -> dict[str, torch.Tensor]:
    """The tensors `keys` of a safetensors file (after 8 bytes of length, a JSON header of dtype, shape
    and byte range per tensor) read one at a time into memory they own: as much as mapping the file."""
    tensors = {}
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        try:
            length = int.from_bytes(file.read(8), "little")
            header, start = json.loads(file.read(length)), 8 + length
            for key in keys:
                entry = header[key]
                dtype, shape, (begin, end) = _SAFETENSORS_DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
                if end - begin != math.prod(shape) * dtype.itemsize or start + end > size:
                    raise ValueError(f"{key}: bytes {begin}..{end} of {size - start} do not hold {entry['dtype']} {shape}")
                data = torch.empty(end - begin, dtype=torch.uint8)
                file.seek(start + begin)
                if file.readinto(data.numpy()) != end - begin:
                    raise ValueError(f"{key}: the file ends inside it")
                tensors[key] = data.view(dtype).reshape(shape)
        except (ValueError, KeyError, TypeError) as err:  # a file changed since its header was checked
            raise _unreadable(path, err) from err
    return tensors


def vae_part(keys: list[str]) -> list[str]:
    """The keys of a file to read: all of them, or in a full model checkpoint (a diffusion model with its
    VAE under `vae.`, as LTX-2 ships) only the VAE's, so the rest of the file is never read (safetensors
    tensors are read one by one from the mapped file)."""
    part = [k for k in keys if k.startswith("vae.")]
    return part if part and len(part) < len(keys) else keys


def read_shapes(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Like `read_checkpoint`, with meta-device tensors (names, shapes, dtypes) and without reading
    the weights: the safetensors header, or a pickle memory-mapped where its format allows."""
    path = _existing(path)
    if path.lower().endswith(SAFETENSORS_SUFFIXES):
        try:
            with safe_open(path, framework="pt", device="cpu") as f:
                shapes = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in vae_part(list(f.keys()))}
                metadata = dict(f.metadata() or {})
        except (SafetensorError, OSError, ValueError) as err:
            raise _unreadable(path, err) from err
        return {k: torch.empty(shape, dtype=_SAFETENSORS_DTYPES.get(dt, torch.uint8), device="meta")
                for k, (shape, dt) in shapes.items()}, metadata
    tensors, metadata = (_read_pickle(path, mmap=True), {}) if path.lower().endswith(PICKLE_SUFFIXES) else read_checkpoint(path)
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in tensors.items()}, metadata


def _existing(path) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file: give the VAE file inside it (a "
                              ".safetensors file; in a diffusers folder, diffusion_pytorch_model.safetensors in vae)")
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def _unreadable(path: str, err: Exception) -> CheckpointError:
    return CheckpointError(f"{os.path.basename(path)} is not a readable safetensors file ({err}); it is truncated or "
                           "corrupt (an interrupted download, a full disk): download it again")


def unsafe_globals(path: str) -> list[str]:
    """The Python callables a pickle checkpoint would import besides tensor types (empty for a plain
    state dict), read from its pickle opcodes without executing anything; [] where the format
    (pre-1.6 torch.save) cannot be scanned, in which case `torch.load(weights_only=True)` decides."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except (ValueError, RuntimeError, OSError, pickle.UnpicklingError, AttributeError):
        return []


def _load_pickle(path: str, mmap: bool):
    if mmap:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise  # anything but "this legacy (non-zip) format cannot be mapped"
    return torch.load(path, map_location="cpu", weights_only=True)


def _refuse_code(name: str, found: list[str]) -> CheckpointError:
    what = f" ({', '.join(found)})" if found else ""
    return CheckpointError(
        f"{name} holds Python objects besides tensors{what}, and StreamVAE never unpickles code from a checkpoint, "
        "so nothing in it was run. Use the .safetensors release of this VAE, or convert the file with a tool you trust.")


def _read_pickle(path: str, mmap: bool = False) -> dict[str, torch.Tensor]:
    name = os.path.basename(path)
    found = unsafe_globals(path)  # named before loading; weights_only=True would refuse them anyway
    if found:
        raise _refuse_code(name, found)
    try:
        obj = _load_pickle(path, mmap)
    except pickle.UnpicklingError as err:  # weights_only's: a global it does not allow, or bytes no pickle has
        if "Unsupported global" in str(err):
            raise _refuse_code(name, re.findall(r"GLOBAL ([\w.]+)", str(err))) from err
        raise CheckpointError(f"{name} is not a PyTorch checkpoint (its bytes are neither a zip archive nor a pickle "
                              "of tensors): it is truncated, corrupt or another kind of file; download it again") from err
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise CheckpointError(f"{name} could not be read as a PyTorch checkpoint ({str(err).splitlines()[0]}); "
                              "it is truncated or corrupt: download it again") from err
    while isinstance(obj, Mapping) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        inner = next((obj[k] for k in _NESTED_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{name} does not contain a state dict (found {type(obj).__name__})")
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def save_checkpoint(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike, config: Mapping | None = None) -> None:
    """Write a safetensors checkpoint; `config` (e.g. {"norm_num_groups": 8}) goes into its metadata."""
    metadata = {CONFIG_METADATA_KEY: json.dumps(dict(config))} if config else None
    save_file({k: v.contiguous() for k, v in state_dict.items()}, os.fspath(path), metadata=metadata)


def _candidates(sd: dict[str, torch.Tensor]):
    """The state dict as given, with a prefix all keys share removed, and the part of a bigger
    checkpoint (e.g. a full diffusion checkpoint) under a VAE prefix."""
    yield sd
    for prefix in _KEY_PREFIXES:
        part = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        if part:
            yield part


# Key fragments of models that are often put into models/vae by mistake, and where they belong.
_FOREIGN = (
    (("lora_", ".lora.", "lora_A", "lora_B", ".alpha", "lokr_", "hada_"),
     "a LoRA (low-rank adapter), not a VAE: load it with a LoRA loader (models/loras)"),
    (("text_model.", "encoder.block.", "shared.weight", "token_embedding", "embed_tokens", "text_projection",
      "transformer.resblocks."),
     "a text encoder (CLIP/T5/LLM), not a VAE: it belongs in models/text_encoders"),
    (("diffusion_model.", "input_blocks.", "double_blocks.", "single_blocks.", "joint_blocks.", "time_embed",
      "time_embedding.", "patch_embedding.", "blocks.0.self_attn", "blocks.0.cross_attn", "transformer_blocks."),
     "a diffusion model (UNet/DiT), not a VAE: it belongs in models/diffusion_models"),
    (("encoder.down.0.", "decoder.up.0.", "encoder.mid.attn_1."),
     "an image VAE (SD/SDXL/Flux style): use core ComfyUI's Load VAE; StreamVAE handles the video VAEs"),
)


def _what_it_looks_like(keys) -> str | None:
    for fragments, description in _FOREIGN:
        if any(fragment in key for key in keys for fragment in fragments):
            return description
    return None


def detect_family(state_dict: Mapping[str, torch.Tensor]) -> tuple[type[VideoVAE], dict[str, torch.Tensor]]:
    """The family class whose layout the keys match, and the state dict in that family's key names."""
    sd = dict(state_dict)
    for candidate in _candidates(sd):
        for cls in FAMILIES:
            native = cls.native_state_dict(candidate)
            if native is not None:
                return cls, native
    if not sd:
        raise CheckpointError("the checkpoint holds no tensors: it is empty or not a model file; download it again")
    for candidate in _candidates(sd):
        for cls in FAMILIES:
            refused = cls.refusal(candidate)
            if refused:
                raise CheckpointError(refused)
    stripped = next((c for c in list(_candidates(sd))[1:] if len(c) == len(sd)), sd)  # a prefix all keys share
    tried = "; ".join(f"{cls.family}: missing {', '.join(k for k in cls.probe_keys if k not in stripped)}" for cls in FAMILIES)
    sample = ", ".join(sorted(sd)[:5])
    looks = _what_it_looks_like(sd)
    head = f"this looks like {looks}. " if looks else ""
    raise CheckpointError(
        f"not a video VAE checkpoint StreamVAE knows: {head}({len(sd)} tensors, e.g. {sample}). Families tried: {tried}. "
        f"Pick a {', '.join(f'{spec.display_name} ({spec.download})' for spec in SPECS[:-1])} or "
        f"{SPECS[-1].display_name} ({SPECS[-1].download}) VAE file.")


def _one_wrong_tensor(cls: type[VideoVAE], cfg, given: Mapping[str, torch.Tensor], wrong: list[str]):
    """When several tensors mismatch the config read from the shapes, the one tensor that explains them
    all, as (key, shape the others imply), or None. A config value is read from one tensor, so when
    that tensor is the damaged one every tensor sized by the value mismatches instead; a config with
    one value changed (an int field, or one entry of an int tuple, tried near its value and at the
    sizes the mismatched tensors have) under which a single tensor mismatches names it. Meta-device
    builds only (about 10 ms each)."""
    if not dataclasses.is_dataclass(cfg):
        return None
    shapes = {k: tuple(v.shape) for k, v in given.items()}
    sizes = {d for k in wrong for d in shapes[k]}

    def variants():  # the likeliest first: int fields before tuple entries, near values before the sizes
        fields = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg)]
        entries = [(name, None, value) for name, value in fields if isinstance(value, int) and not isinstance(value, bool)]
        entries += [(name, i, v) for name, value in fields if isinstance(value, tuple)
                    for i, v in enumerate(value) if isinstance(v, int)]
        tried = set()
        for near in (True, False):
            for name, i, old in entries:
                for new in ({old // 2, old * 2, old - 2, old - 1, old + 1, old + 2} if near else sizes) - {old}:
                    if new > 0 and (name, i, new) not in tried:
                        tried.add((name, i, new))
                        value = getattr(cfg, name)
                        yield dataclasses.replace(cfg, **{name: new if i is None else value[:i] + (new,) + value[i + 1:]})

    for variant in variants():
        try:
            with torch.device("meta"):
                expected = {k: tuple(v.shape) for k, v in cls(variant).state_dict().items()}
        except Exception:  # a value the family's constructor refuses: not the config of this file
            continue
        if expected.keys() == shapes.keys():
            culprits = [k for k in expected if expected[k] != shapes[k]]
            if len(culprits) == 1:
                return culprits[0], expected[culprits[0]]
    return None


def _check_layout(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], family: str,
                  explain=None) -> None:
    """CheckpointError naming the missing, unexpected and mis-shaped keys; `explain(wrong keys)` may
    name the one tensor behind several mismatches (`_one_wrong_tensor`)."""
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    wrong = [k for k in sorted(set(expected) & set(given)) if tuple(expected[k].shape) != tuple(given[k].shape)]
    culprit = explain(wrong) if explain is not None and len(wrong) > 1 and not missing and not unexpected else None
    if culprit is not None:
        key, implied = culprit
        raise CheckpointError(f"checkpoint does not match the {family} VAE layout; wrong shape: {key} "
                              f"{tuple(given[key].shape)} (the other {len(given) - 1} tensors imply {implied}): the file "
                              "is modified or damaged; download it again")
    mismatched = [f"{k} {tuple(given[k].shape)} (expected {tuple(expected[k].shape)})" for k in wrong]
    problems = []
    for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
        if keys:
            shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
            problems.append(f"{label}: {shown}")
    if problems:
        raise CheckpointError(f"checkpoint does not match the {family} VAE layout; " + "; ".join(problems))


def load(
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    encode_dtype: torch.dtype | None = None,
    decode_dtype: torch.dtype | None = None,
    config: Mapping | None = None,
    allow_nonfinite: bool = False,
) -> VideoVAE:
    """Build the VAE a checkpoint (path or state dict) describes, with its weights, ready for inference.

    `dtype` is the compute dtype of the weights, whatever the file stores (fp32, bf16, fp16 or fp8);
    `encode_dtype` / `decode_dtype` override it for one half. `config` overrides config fields that
    the tensor shapes cannot tell (SeedVR2's `norm_num_groups`; the family's `load_choices`, such as
    HunyuanVideo 1.5's `attention`, are the ones a front end offers). A weight with NaN/Inf values is a
    CheckpointError naming it (one such value blanks a colour channel or the whole latent), unless
    `allow_nonfinite`.
    """
    if isinstance(source, Mapping):
        state_dict, metadata = dict(source), {}
    else:
        state_dict, metadata = read_checkpoint(source)
    model, state_dict = build_empty(state_dict, metadata, config)
    if not allow_nonfinite:
        check_finite(state_dict)
    target = _target_dtypes(model, dtype, encode_dtype, decode_dtype)
    # Each tensor goes from the file's dtype straight to its half's dtype: casting everything to
    # `dtype` first would round fp32/fp16 encoder weights through bf16 when only decode is bf16. Each
    # one read is let go once cast, so the peak is the file or the model, whichever is larger.
    model.load_state_dict({k: state_dict.pop(k).to(target(k)) for k in list(state_dict)}, strict=True, assign=True)
    return model.to(device).eval().requires_grad_(False)


def _nonfinite_count(tensor: torch.Tensor) -> int:
    if not tensor.dtype.is_floating_point:
        return 0
    if tensor.dtype.itemsize == 1:  # fp8: torch has no isfinite for it; the upcast is exact
        tensor = tensor.float()
    return int((~torch.isfinite(tensor)).sum())


def check_finite(state_dict: Mapping[str, torch.Tensor]) -> None:
    """CheckpointError naming the weights with NaN/Inf values (checked a tensor at a time)."""
    bad = [(key, count) for key, tensor in state_dict.items() if (count := _nonfinite_count(tensor))]
    if bad:
        named = ", ".join(f"{key} ({count} of {state_dict[key].numel()} values)" for key, count in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise CheckpointError(
            f"the checkpoint has NaN/Inf weights: {named}{more}. They would give wrong frames (a colour channel at 0, "
            "an all-NaN latent): the file is damaged (an interrupted download, a broken conversion); download it "
            "again. To load it anyway: vae.load(..., allow_nonfinite=True) (python -m vae: --allow-nonfinite)")


def _target_dtypes(model: VideoVAE, dtype: torch.dtype, encode_dtype: torch.dtype | None,
                   decode_dtype: torch.dtype | None):
    """key -> the dtype its weight is computed in: the encoder's or decoder's own, else `dtype`."""
    names = {id(module): name for name, module in model.named_modules()}
    prefixes = [(names[id(m)] + ".", encode_dtype or dtype) for m in model.encode_modules()]
    prefixes += [(names[id(m)] + ".", decode_dtype or dtype) for m in model.decode_modules()]
    return lambda key: next((d for prefix, d in prefixes if key.startswith(prefix)), dtype)


def build_empty(state_dict: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None,
                config: Mapping | None = None) -> tuple[VideoVAE, dict[str, torch.Tensor]]:
    """The model a state dict describes, on the meta device (no weights), and the state dict in its key
    names, after the strict layout check. Tensors may be on the meta device (only shapes are used).
    Config overrides: the file's `streamvae_config` metadata, then `config`."""
    metadata = metadata or {}
    try:
        stored = json.loads(metadata[CONFIG_METADATA_KEY]) if CONFIG_METADATA_KEY in metadata else {}
    except json.JSONDecodeError as err:
        raise CheckpointError(f"the checkpoint's {CONFIG_METADATA_KEY} metadata is not valid JSON ({err}); "
                              "rewrite it with vae.save_checkpoint") from None
    cls, native = detect_family(state_dict)
    overrides = {**_checked_config(cls, stored, f"the checkpoint's {CONFIG_METADATA_KEY} metadata"),
                 **_checked_config(cls, config or {}, "vae.load's config")}
    try:
        cfg = cls.config_from_state_dict(native, {**cls.metadata_overrides(metadata), **overrides})
    except KeyError as err:
        raise CheckpointError(f"checkpoint does not match the {cls.family} VAE layout; missing: {err.args[0]} "
                              "(the file is incomplete: download it again)") from None
    except LayoutError as err:
        raise CheckpointError(f"the checkpoint has the {cls.family} VAE's key layout, but sizes no variant StreamVAE "
                              f"knows: {err}") from None
    except ValueError as err:  # a config value the shapes cannot tell, and the file does not say
        raise CheckpointError(str(err)) from None
    with torch.device("meta"):
        model = cls(cfg)
    _check_layout(model.state_dict(), native, cls.family, lambda wrong: _one_wrong_tensor(cls, cfg, native, wrong))
    _check_numbers(model.state_dict(), native)
    return model, native


def _check_numbers(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor]) -> None:
    """CheckpointError naming the weights stored as integers (or other non-float numbers) where the model
    computes with floats: a quantized checkpoint, whose integers mean nothing without its scales, and
    no quantization format is known here that says how to apply them (fp8 is a float, cast on load)."""
    named = [f"{k} ({str(v.dtype).removeprefix('torch.')})" for k, v in given.items()
             if not v.dtype.is_floating_point and expected[k].dtype.is_floating_point]
    if named:
        more = f" and {len(named) - 5} more" if len(named) > 5 else ""
        raise CheckpointError(
            f"the checkpoint stores weights as integers: {', '.join(named[:5])}{more}. It is quantized (int8 or "
            "similar), and StreamVAE knows no format that says how to turn them back into weights; used as they are "
            "they decode wrong frames. Use the fp32, fp16, bf16 or fp8 release of this VAE.")


def _checked_config(cls: type[VideoVAE], given, source: str) -> dict:
    """`given` (config overrides from `source`) once it is an object of `cls`'s config fields, each value
    of its default's kind (`_kind`); CheckpointError naming the field otherwise."""
    if not isinstance(given, Mapping):
        raise CheckpointError(f"{source} must be an object of config fields, e.g. {{\"norm_num_groups\": 8}}; got "
                              f"{json.dumps(given, default=repr)}. Rewrite it: vae.save_checkpoint(..., config=...)")
    default = inspect.signature(cls.__init__).parameters["cfg"].default  # every family's constructor has one
    fields = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
    for name, value in given.items():
        if name not in fields:
            raise CheckpointError(f"{source}: {name!r} is not a {cls.family} config field (those are "
                                  f"{', '.join(sorted(fields))})")
        kind = _kind(fields[name])
        if kind is not None and not kind[1](value):
            raise CheckpointError(f"{source}: {name} must be {kind[0]}, got {json.dumps(value, default=repr)}")
    return dict(given)


def _kind(default):
    """(what a value in place of `default` must be, in words; its test), or None where the family checks
    it (a list of block descriptions). A whole number is >= 1 (>= 0 where the default is 0)."""
    if isinstance(default, tuple):
        inner = _kind(default[0]) if default else None
        return inner and (f"a list, each {inner[0]}", lambda v: isinstance(v, (list, tuple)) and all(map(inner[1], v)))
    if isinstance(default, bool):
        return "true or false", lambda v: isinstance(v, bool)
    if isinstance(default, int):
        low = 0 if default == 0 else 1
        return f"a whole number >= {low}", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low
    if isinstance(default, float):
        return "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if isinstance(default, str):
        return "text", lambda v: isinstance(v, str)
    return None
