"""Mesh rewrites the planners try: more data-parallel devices, a tensor axis split off, HSDP,
context or expert parallelism on the same GPUs. Each takes and returns mesh text (`--mesh`);
None when the rewrite does not apply to that mesh. `roles`: --axis-roles (the roles of axes the model
names itself, e.g. tunix's `fsdp, tp` or EasyDeL's `dp, fsdp, ep, tp, sp`): an axis of the role the
rewrite grows that the mesh already has at size 1 is grown in its own name, not added again."""

from __future__ import annotations

from jaxmem.program import layouts

# the axes a same-GPU rewrite takes devices from: replicas first (they hold the most redundant
# state), then fsdp (whose state sharding it thins)
_DONORS = ("data", "fsdp")


def roles_for(roles: str | None, mesh: str) -> str | None:
    """--axis-roles for a rewritten `mesh`: the entries naming axes it still has (a rewrite may rename
    the axis it split, HSDP's data/fsdp pair)."""
    if not roles:
        return roles
    names = {n.strip() for n, _, _ in (a.partition("=") for a in mesh.split(","))}
    kept = [e for e in roles.split(",") if e.partition("=")[0].strip() in names]
    return ",".join(kept) or None


def _text(axes) -> str:
    return ",".join(f"{n}={s}" for n, s in axes)


def scale_data(mesh: str, factor: int, roles: str | None = None) -> str | None:
    """The first axis that splits the batch (data, fsdp or expert) `factor` times larger."""
    spec = layouts.parse_mesh(mesh, roles)
    if not spec.batch_axes:
        return None
    name = spec.batch_axes[0]
    return _text((n, s * factor if n == name else s) for n, s in spec.axes)


def with_data_size(mesh: str, d: int, roles: str | None = None) -> str:
    """The first axis that splits the batch at size `d` (a `data` axis in front if there is none)."""
    spec = layouts.parse_mesh(mesh, roles)
    if not spec.batch_axes:
        return _text((("data", d),) + spec.axes)
    first = spec.batch_axes[0]
    return _text((n, d if n == first else s) for n, s in spec.axes)


def other_batch(mesh: str, roles: str | None = None) -> int:
    """The product of the batch axes other than the one a devices search varies."""
    spec = layouts.parse_mesh(mesh, roles)
    return spec.axis_size(spec.batch_axes[1:]) if spec.batch_axes else 1


def split_model_axis(mesh: str, roles: str | None = None) -> str | None:
    """`data=8` -> `data=4,model=2`: the same devices, a tensor-parallel axis of 2."""
    spec = layouts.parse_mesh(mesh, roles)
    axes = list(spec.axes)
    tensor = spec.axis_of("tensor")
    if tensor is not None and spec.axis_size(tensor) > 1:
        return None
    for i, (name, size) in enumerate(axes):
        if size % 2 == 0 and size >= 2:
            axes[i] = (name, size // 2)
            if tensor is not None:   # the model's own tensor axis, at size 1 (tunix's tp=1)
                return _text((n, 2 if n == tensor else s) for n, s in axes)
            if axes[i][1] == 1 and len(axes) == 1:
                return None  # no data axis would be left
            return _text(axes) + ",model=2"
    return None


def hsdp(mesh: str, hosts: int, roles: str | None = None) -> str | None:
    """FSDP within a host, replicas across hosts, on the same devices: the state axis of size N
    becomes fsdp=N/hosts beside data=hosts (or data x hosts where a data axis exists)."""
    spec = layouts.parse_mesh(mesh, roles)
    state = spec.state_axes
    if hosts < 2 or len(state) != 1:
        return None
    name, n = state[0], spec.axis_size(state[0])
    if n % hosts or n // hosts < 2:
        return None
    if spec.role(name) == "data":   # the legacy FSDP over data: renamed, split in two
        i = spec.names.index(name)
        axes = list(spec.axes)
        return _text(axes[:i] + [("data", hosts), ("fsdp", n // hosts)] + axes[i + 1:])
    data = spec.axis_of("data")
    if data is None:
        return _text([("data", hosts)] + [(a, s // hosts if a == name else s) for a, s in spec.axes])
    return _text((a, s * hosts if a == data else s // hosts if a == name else s) for a, s in spec.axes)


def pipelined(mesh: str, k: int, roles: str | None = None) -> list[str]:
    """Meshes with a stage axis of k first (the outermost: stages across hosts, as MaxText's DCN pipeline):
    its devices taken from the replicas (the same GPUs), and the mesh as it is on k times the GPUs."""
    spec = layouts.parse_mesh(mesh, roles)
    if spec.axis_of("stage") is not None or k < 2:
        return []
    out = []
    data = spec.axis_of("data")
    if data is not None and spec.axis_size(data) % k == 0:
        out.append(_text([("stage", k)] + [(a, s // k) if a == data else (a, s) for a, s in spec.axes
                                          if not (a == data and s == k)]))
    out.append(_text([("stage", k)] + list(spec.axes)))
    return out


def carve(mesh: str, role: str, k: int, roles: str | None = None) -> str | None:
    """A new axis of `role` (context or expert) of size k, its devices taken from the replicas (data)
    first, then from fsdp: the same GPUs. None if the mesh has that role already or no donor divides."""
    spec = layouts.parse_mesh(mesh, roles)
    own = spec.axis_of(role)   # the model's own axis of that role at size 1 (EasyDeL's sp=1) is grown
    if (own is not None and spec.axis_size(own) > 1) or k < 2:
        return None
    for donor_role in _DONORS:
        donor = spec.axis_of(donor_role)
        if donor is not None and spec.axis_size(donor) % k == 0:
            axes = [(a, s // k if a == donor else k if a == own else s) for a, s in spec.axes]
            return _text(axes if own is not None else axes + [(role, k)])
    return None
