"""How much memory the running requests' caches may take (``serve --kv-cache-mb``), as positions the scheduler
admits requests against (:class:`~quickdraft.engine.scheduler.SchedulerSettings`, ``max_positions``).

Rules:
- A request reserves a position for every prompt token and every token it may generate (``max_tokens``), in the
  target's cache and, where one is loaded, the draft model's: a position costs the sum of their keys and values.
- ``--kv-cache-mb MB`` sets the memory; 0 sets no bound. Without it, the bound is :data:`AUTO_SHARE` of the memory
  available once the models are loaded (the smaller of the system's ``MemAvailable`` and what the limits of this
  process's cgroup and the groups above it leave, reclaimable file cache counted as free), times this server's share
  of the machine (a replica's: one of N), less its prefix cache's budget.
- Where the memory available cannot be read, the runtime does not say what a position costs, or the caches are a
  GPU's, there is no bound unless ``--kv-cache-mb`` gives one, and the note says so.
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.errors import ConfigError

AUTO_SHARE = 0.75  # of the memory available: the rest for activations, the draft's kept caches, the OS
MB = 2**20


def available_bytes(root: Path = Path("/")) -> int | None:
    """Memory this process may still take: the system's available memory, within the limit of its own cgroup and
    of every group above it (v2 or v1; a group's file cache it can reclaim counts as free); None where none of
    them can be read."""
    found = []
    meminfo = root / "proc/meminfo"
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    for group in _own_groups(root):
        v2 = (group / "memory.max").exists()
        names = ("memory.max", "memory.current", "inactive_file") if v2 else (
            "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")  # fmt: skip
        limit, usage = _number(group / names[0]), _number(group / names[1])
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes a huge number for no limit
            found.append(max(0, limit - usage + _stat(group / "memory.stat", names[2])))
    return min(found) if found else None


def _own_groups(root: Path) -> list[Path]:
    """The directories of this process's memory cgroup and of the groups above it (/proc/self/cgroup: ``N:...memory
    ...:PATH`` for v1, else ``0::PATH`` where /sys/fs/cgroup is v2's); a path not visible here (a namespace) is its
    hierarchy's root."""
    try:
        entries = [line.split(":", 2) for line in (root / "proc/self/cgroup").read_text().splitlines()]
    except OSError:
        return []
    cgroup = root / "sys/fs/cgroup"
    v1 = [path for _, controllers, path in entries if "memory" in controllers.split(",")]
    v2 = (
        [path for _, controllers, path in entries if controllers == ""]
        if (cgroup / "cgroup.controllers").exists()
        else []
    )
    if not v1 and not v2:
        return []
    base = cgroup / "memory" if v1 else cgroup
    own = base / (v1 or v2)[0].lstrip("/")
    own = own if own.is_dir() else base
    return [own, *(parent for parent in own.parents if parent.is_relative_to(base))]


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, or "max": no limit
        return None


def _stat(path: Path, name: str) -> int:
    """A ``memory.stat`` entry (0 where it cannot be read)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def position_budget(
    kv_cache_mb: int | None, bytes_per_position: int, prefix_cache_mb: int, share: float = 1.0, on_host: bool = True
) -> tuple[int | None, str]:
    """(the positions the running requests may reserve, None: no bound; a line saying so for the user).
    ``on_host``: the caches are in the host's memory (not a GPU's, which is not measured here)."""
    if kv_cache_mb == 0:
        return None, "request caches: no bound (--kv-cache-mb 0)"
    if bytes_per_position <= 0:
        return None, "request caches: no bound (this runtime does not say what a cached position costs)"
    if kv_cache_mb is None and not on_host:
        return None, "request caches: no bound (they are the GPU's: give --kv-cache-mb)"
    if kv_cache_mb is None:
        available = available_bytes()
        if available is None:
            return None, "request caches: no bound (the memory available cannot be read here; give --kv-cache-mb)"
        budget = int(AUTO_SHARE * available * share - prefix_cache_mb * MB)  # each replica keeps its own prefixes
        if budget < bytes_per_position:
            raise ConfigError(
                f"too little memory is left for the requests' caches ({available // MB} MB available, "
                f"--prefix-cache-mb {prefix_cache_mb}): lower --prefix-cache-mb or give --kv-cache-mb",
                "kv_cache_mb",
            )
        how = f"{AUTO_SHARE:.0%} of the {available // MB} MB available" + (f", {share:.2g} of it" if share < 1 else "")
    else:
        budget, how = kv_cache_mb * MB, "--kv-cache-mb"
        available = available_bytes() if on_host else None
        if available is not None and budget + prefix_cache_mb * MB > available * share:  # allowed, but said
            whose = " to each replica" if share < 1 else ""
            prefixes = " with --prefix-cache-mb" if prefix_cache_mb else ""
            how += (
                f"{prefixes}, more than the {int(available * share) // MB} MB available{whose}: full caches would run "
                "out of memory"
            )
    positions = budget // bytes_per_position
    if positions < 1:
        raise ConfigError(f"--kv-cache-mb {kv_cache_mb} holds no cache position (one costs {bytes_per_position} bytes)",
                          "kv_cache_mb")  # fmt: skip
    per = f"{bytes_per_position / 1024:.0f} KiB each"
    return positions, f"request caches: up to {budget // MB} MB ({how}), {positions:,} positions at {per}"
