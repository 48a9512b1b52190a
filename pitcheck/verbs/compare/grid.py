"""A sweep's grid: the axes (every combination is a cell) and the options every cell shares, loaded
from a TOML file (see pitcheck.verbs.compare), overridden axis by axis, and checked before anything runs."""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path

from ...infra.errors import PitcheckError
from ...model.gradients import AdversaryParams
from ...sources.lm import uses_lm
from ...trajectory import RunConfig, default_backend
from ...trajectory.plan import head_named

AXES = ("retraction", "precision", "adversary", "optimizer", "lr", "head", "shape", "shards", "seed")
# axes a grid holds only when its file (or an override) names them: a grid without one is the grid it was
# before the axis existed (its grid.json, cell names and summary.csv unchanged); absent, the value is this
OPTIONAL_AXES = {"shards": 1}
GRID_KEYS = ("steps", "records_per_decade", "axes", "fixed", "description")
# RunConfig fields that are axes (or derived from one), so not allowed in [fixed]
AXIS_FIELDS = {"retraction", "precision", "adversary", "optimizer", "lr", "head", "vocab", "dim", "shards", "seed",
               "steps", "records_per_decade"}
# more cells than this are refused unless --max-cells says otherwise: a grid typed by mistake (10^6 cells)
# would otherwise enumerate for minutes and start that many runs
MAX_CELLS = 10000


@dataclass(frozen=True)
class Grid:
    axes: dict
    steps: int
    records_per_decade: int = 10
    fixed: dict = field(default_factory=dict)
    description: str = ""
    source: str = ""

    def to_json(self) -> dict:
        return {"source": self.source, "description": self.description, "steps": self.steps,
                "records_per_decade": self.records_per_decade, "axes": self.axes, "fixed": self.fixed}


def builtin_grid_path(name: str) -> str:
    return f"pitcheck/grids/{name}.toml"


def _builtin_text(name: str) -> str:
    return resources.files("pitcheck").joinpath("grids", f"{name}.toml").read_text()


def parse_shape(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return int(value[0]), int(value[1])
    if isinstance(value, str):
        parts = value.lower().replace(" ", "").split("x")
        if len(parts) == 2 and all(p.isascii() and p.isdigit() for p in parts):
            return int(parts[0]), int(parts[1])
    raise PitcheckError(f"shape must be 'VxD' (e.g. '256x16') or [V, D], got {value!r}")


def adversary_spec(value: str) -> str:
    """'dense_output+sparse_input' (or with commas) -> the RunConfig spec 'dense_output,sparse_input'."""
    if not isinstance(value, str):
        raise PitcheckError(f"adversary must be a string, got {value!r}")
    return ",".join(p.strip() for p in value.replace("+", ",").split(",") if p.strip())


def adversary_label(spec: str) -> str:
    return "+".join(spec.split(","))


def grid_from_dict(data: dict, source: str, max_cells: int = MAX_CELLS) -> Grid:
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise PitcheckError(f"{source}: unknown key {unknown[0]!r}; a grid has {', '.join(GRID_KEYS)}")
    axes_in = data.get("axes", {})
    if not isinstance(axes_in, dict):
        raise PitcheckError(f"{source}: [axes] must be a table")
    bad = sorted(set(axes_in) - set(AXES))
    if bad:
        raise PitcheckError(f"{source}: unknown axis {bad[0]!r}; choose from {', '.join(AXES)}")
    defaults = RunConfig()
    axes = {}
    for name in AXES:
        if name in axes_in:
            values = axes_in[name] if isinstance(axes_in[name], list) else [axes_in[name]]
        elif name in OPTIONAL_AXES:
            continue
        elif name == "shape":
            values = [f"{defaults.vocab}x{defaults.dim}"]
        else:
            values = [getattr(defaults, name)]
        if not values:
            raise PitcheckError(f"{source}: axis {name!r} is empty")
        if name == "shape":
            values = [f"{v}x{d}" for v, d in (parse_shape(x) for x in values)]
        elif name == "adversary":
            values = [adversary_label(adversary_spec(v)) for v in values]
        elif name == "lr":
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
                raise PitcheckError(f"{source}: axis lr must hold numbers, got {values!r}")
            values = [float(v) for v in values]
        elif name == "seed":
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
                raise PitcheckError(f"{source}: axis seed must hold integers >= 0, got {values!r}")
        elif name == "shards":
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise PitcheckError(f"{source}: axis shards must hold integers >= 1 (ranks Z is sharded over), "
                                    f"got {values!r}")
        elif any(not isinstance(v, str) for v in values):
            raise PitcheckError(f"{source}: axis {name} must hold strings, got {values!r}")
        if len(set(values)) != len(values):
            raise PitcheckError(f"{source}: axis {name} repeats a value: {values!r}")
        axes[name] = values
    fixed = data.get("fixed", {})
    if not isinstance(fixed, dict):
        raise PitcheckError(f"{source}: [fixed] must be a table")
    known = {f.name for f in fields(RunConfig)} - AXIS_FIELDS
    bad = sorted(set(fixed) - known)
    if bad:
        name = bad[0]
        if name in ("steps", "records_per_decade"):
            what = f"is a top-level key of the grid ({name} = ..., before any table)"
        elif name in ("vocab", "dim"):
            what = "is part of the shape axis (give shape = [\"VxD\"] under [axes])"
        elif name in AXIS_FIELDS:
            what = "is an axis (give it under [axes])"
        else:
            what = "is not a run option"
        raise PitcheckError(f"{source}: [fixed] {name!r} {what}; [fixed] takes {', '.join(sorted(known))}")
    steps = data.get("steps", defaults.steps)
    rpd = data.get("records_per_decade", defaults.records_per_decade)
    for name, value in (("steps", steps), ("records_per_decade", rpd)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PitcheckError(f"{source}: {name} must be a positive integer, got {value!r}")
    count = cell_count(axes)
    if count > max_cells:
        raise PitcheckError(f"{source}: the grid has {count} cells, more than the limit of {max_cells} "
                            "(--max-cells N raises it)")
    if "lm" in fixed and not any(uses_lm(adversary_spec(a)) for a in axes["adversary"]):
        raise PitcheckError(f"{source}: [fixed.lm] sets options of the lm source, which no cell uses "
                            f"(adversaries {', '.join(axes['adversary'])})")
    grid = Grid(axes=axes, steps=steps, records_per_decade=rpd, fixed=dict(fixed),
                description=str(data.get("description", "")), source=source)
    for _ in configs(grid):  # every cell's config is checked now, before anything runs
        pass
    return grid



def axis_values(grid: Grid, name: str) -> list:
    """An axis's values; an optional axis the grid does not hold has its one default value."""
    return grid.axes[name] if name in grid.axes else [OPTIONAL_AXES[name]]


def cell_count(axes: dict) -> int:
    """The number of combinations of the axes, from their lengths alone (nothing enumerated); an upper
    bound on the cells, since the baseline heads take one cell for all the retractions."""
    return math.prod(len(v) for v in axes.values())


def load_grid(path: str | None = None, quick: bool = False, max_cells: int = MAX_CELLS) -> Grid:
    """The grid in a TOML file, or the built-in one (`quick`: the small one)."""
    if path is not None and quick:
        raise PitcheckError("--quick picks the built-in quick grid: give --config or --quick, not both")
    if path is None:
        name = "quick" if quick else "default"
        source, text = builtin_grid_path(name), _builtin_text(name)
    else:
        source = str(path)
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PitcheckError(f"cannot read grid {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PitcheckError(f"{source} is not valid TOML: {exc}") from None
    return grid_from_dict(data, source, max_cells)


def override(grid: Grid, max_cells: int = MAX_CELLS, **axes) -> Grid:
    """The grid with some axes replaced (values as in the TOML file); None leaves an axis as it is."""
    data = {"steps": grid.steps, "records_per_decade": grid.records_per_decade, "fixed": grid.fixed,
            "description": grid.description, "axes": dict(grid.axes)}
    changed = []
    for name, values in axes.items():
        if values is None:
            continue
        if name == "steps":
            data["steps"] = values
        else:
            data["axes"][name] = values
        changed.append(f"{name} {values if name == 'steps' else ','.join(str(v) for v in values)}")
    source = f"{grid.source}, overridden: {'; '.join(changed)}" if changed else grid.source
    return grid_from_dict(data, source, max_cells)



def configs(grid: Grid):
    """Every combination of the axes, in axis order, as (axis values, its checked RunConfig); a baseline
    head (no retraction) takes the default retraction, so its combinations repeat one config."""
    fixed = dict(grid.fixed)
    params = fixed.pop("adversary_params", {})
    if not isinstance(params, dict):
        raise PitcheckError(f"{grid.source}: [fixed.adversary_params] must be a table")
    try:
        params = AdversaryParams(**params)
    except TypeError:
        names = ", ".join(f.name for f in fields(AdversaryParams))
        raise PitcheckError(f"{grid.source}: [fixed.adversary_params] takes {names}, got "
                            f"{', '.join(sorted(params))}") from None
    for combo in itertools.product(*(axis_values(grid, a) for a in AXES)):
        a = dict(zip(AXES, combo))
        vocab, dim = parse_shape(a["shape"])
        # a sharded cell runs on torch.distributed whatever its precision (fp64 too)
        backend = fixed.get("backend") or ("torch" if a["shards"] > 1 else default_backend(a["precision"]))
        retraction = a["retraction"] if head_named(a["head"]).has_retraction else RunConfig.retraction
        try:
            config = RunConfig(**{**fixed, "backend": backend}, precision=a["precision"], retraction=retraction,
                               adversary=adversary_spec(a["adversary"]), optimizer=a["optimizer"], lr=a["lr"],
                               head=a["head"], vocab=vocab, dim=dim, shards=a["shards"], seed=a["seed"],
                               steps=grid.steps,
                               records_per_decade=grid.records_per_decade, adversary_params=params)
            config.validate(here=True)
        except TypeError as exc:
            raise PitcheckError(f"{grid.source}: {exc}") from None
        except PitcheckError as exc:
            raise PitcheckError(f"{grid.source}: {exc}") from None
        yield a, config
