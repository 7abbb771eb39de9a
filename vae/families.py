"""The registered families: one `FamilySpec` each (`vae/model/<family>/spec.py`), in the order detection
tries them (`loading.detect_family`): Qwen-Image 2.1 before Wan2.2, whose key layout its image-only
(one-frame conv) checkpoints share; HunyuanVideo 1.0 before 1.5, whose probe keys a 1.0 file has too.
Everything outside a family's folder that needs a fact of a family reads it here: the loader, the nodes,
the command line, the benchmarks, the tests (tests/test_families.py runs the contract every family passes
over `SPECS`). Adding a family is a line below (docs/families.md, "Adding a family").
"""
from .model.family_spec import FamilySpec, LoadChoice, LoadInteger
from .model.hv10.spec import SPEC as HV10
from .model.hv15.spec import SPEC as HV15
from .model.ltx2.spec import SPEC as LTX2
from .model.ltx25.spec import SPEC as LTX25
from .model.minimax_h3.spec import SPEC as MINIMAX_H3
from .model.qwen21.spec import SPEC as QWEN21
from .model.seedvr2.spec import SPEC as SEEDVR2
from .model.wan21.spec import SPEC as WAN21
from .model.wan22.spec import SPEC as WAN22

SPECS: tuple[FamilySpec, ...] = (SEEDVR2, WAN21, QWEN21, WAN22, LTX2, LTX25, HV10, HV15, MINIMAX_H3)
NAMES: tuple[str, ...] = tuple(spec.name for spec in SPECS)
# The families with load choices, in the order they declared them: a front end's widgets for the choices
# follow it, and a saved workflow's widget values are positional, so a new family's goes last (placed before
# another's, it would take that one's saved value).
CHOOSING: tuple[FamilySpec, ...] = (HV15, HV10, LTX25)


def spec(name: str) -> FamilySpec:
    """The spec of the family `name` (a `VideoVAE.family`, e.g. a latent file's); KeyError naming the
    registered families otherwise."""
    for candidate in SPECS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no family {name!r}; the families are {', '.join(NAMES)}")


def load_choices() -> tuple[LoadChoice | LoadInteger, ...]:
    """Every family's load choices, in the order they were declared (`CHOOSING`): what a front end offers
    when loading."""
    return tuple(choice for family in CHOOSING for choice in family.load_choices)
