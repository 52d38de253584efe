"""The plots of ``het bench report``: one PNG per paper figure (matplotlib, Agg backend), axes
named with units.
"""

from __future__ import annotations

import os
import sys

from het.bench.report_md import (
    PAPER_AUC_WDL,
    PAPER_FRACS,
    PAPER_MISS,
    _bandwidth,
    _miss,
    _mode,
    _s_label,
    _staleness,
)

PLOTS = {"e2e": "fig7_e2e.png", "staleness": "table2_staleness.png", "missrate": "fig8_missrate.png",
         "scale": "fig9_scale.png"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_e2e(result: dict, path: str) -> None:
    """Fig. 7: samples/s per mode grouped by bandwidth, and sparse bytes per sample."""
    plt = _pyplot()
    rows = result["results"]
    bws = list(dict.fromkeys(r["bandwidth"] for r in rows))
    modes = list(dict.fromkeys(_mode(r["mode"], r.get("staleness")) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(modes)
    for key, ax, label in (("samples_per_s", axes[0], "samples/s"),
                           ("sparse_bytes_per_sample", axes[1], "sparse bytes per sample (B)")):
        for i, mode in enumerate(modes):
            vals = [next((r[key] for r in rows if r["bandwidth"] == b and _mode(r["mode"], r.get("staleness")) == mode),
                         0) for b in bws]
            ax.bar([j + (i - (len(modes) - 1) / 2) * width for j in range(len(bws))], vals, width, label=mode)
        ax.set_xticks(range(len(bws)), [_bandwidth(b) for b in bws])
        ax.set_xlabel("link bandwidth (each way, every link)")
        ax.set_ylabel(label)
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", ncol=len(modes), fontsize=8)
    axes[0].set_title("Training throughput per mode")
    axes[1].set_title("Embedding traffic per sample")
    _save(fig, path)


def plot_staleness(result: dict, path: str) -> None:
    """Table 2: AUC per staleness bound, with the planted AUC and the paper's WDL row."""
    plt = _pyplot()
    rows = sorted(result["results"], key=lambda r: _staleness(r["staleness"]))
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [r.get("auc") for r in rows], "o-", label="measured AUC (synthetic Criteo)")
    planted = [r.get("planted_auc") for r in rows if r.get("planted_auc") is not None]
    if planted:
        ax.axhline(planted[0], ls="--", color="gray", label="planted model's AUC (the ceiling)")
    paper = [(i, PAPER_AUC_WDL[_staleness(r["staleness"])]) for i, r in enumerate(rows)
             if _staleness(r["staleness"]) in PAPER_AUC_WDL]
    if paper:
        ax.plot(*zip(*paper), "s:", color="tab:red", label="paper WDL AUC (Criteo Kaggle)")
    ax.set_xticks(list(xs), [_s_label(r["staleness"]) for r in rows])
    ax.set_xlabel("staleness bound s (clock ticks)")
    ax.set_ylabel("held-out AUC")
    ax.set_title("AUC after the same samples, by staleness bound")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_missrate(result: dict, path: str) -> None:
    """Fig. 8: miss rate against cache size, one panel per trace."""
    plt = _pyplot()
    miss = _miss(result)
    fig, axes = plt.subplots(1, len(miss), figsize=(6 * len(miss), 5.5), squeeze=False)
    styles = {"lru": "o-", "lfu": "s-", "lfu+lookahead": "^-", "belady": "k--", "static-oracle": ":"}
    for ax, (trace, by) in zip(axes[0], miss.items()):
        for policy, style in styles.items():
            if policy in by:
                fracs = sorted(by[policy])
                label = {"lfu+lookahead": f"LFU + lookahead {result.get('lookahead')}", "belady": "Belady (optimal)",
                         "static-oracle": "static oracle"}.get(policy, policy.upper())
                ax.plot([100 * f for f in fracs], [100 * by[policy][f] for f in fracs], style, label=label)
        if trace == "graph":
            for (name, d), color in zip(PAPER_MISS.items(), ("tab:purple", "tab:brown")):
                for policy, ls in (("lru", (0, (5, 3))), ("lfu", (0, (1, 2)))):
                    ax.plot([100 * f for f in PAPER_FRACS], [100 * v for v in d[policy]], ls=ls, color=color,
                            alpha=0.6, label=f"paper {name} {policy.upper()}")
        ax.set_xlabel("cache size (% of the table's rows)")
        ax.set_ylabel("miss rate (%)")
        ax.set_title(f"Miss rate vs cache size: {trace} trace")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)  # below: off the curves
    _save(fig, path)


def plot_scale(result: dict, path: str) -> None:
    """Fig. 9: samples/s against workers and against dim, measured (markers) and projected (lines)."""
    from matplotlib import ticker

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    proj = [p for p in result.get("projected", []) if isinstance(p, dict) and "samples_per_s" in p]
    measured = [m for m in result.get("measured", []) if isinstance(m, dict) and "samples_per_s" in m]
    modes = list(dict.fromkeys([p.get("mode") for p in proj] + [m.get("mode") for m in measured]))
    colors = {m: f"C{i}" for i, m in enumerate(modes)}
    dashes = ["-", "--", ":", "-."]
    for ax, sweep, key in ((axes[0], "workers", "workers"), (axes[1], "dim", "dim")):
        rows = [p for p in proj if p.get("sweep") == sweep and key in p]
        for j, bw in enumerate(dict.fromkeys(p.get("bandwidth") for p in rows)):
            for mode in modes:
                pts = sorted((p[key], p["samples_per_s"]) for p in rows if p.get("mode") == mode
                             and p.get("bandwidth") == bw)
                if pts:
                    ax.plot(*zip(*pts), dashes[j % len(dashes)], color=colors[mode],
                            label=f"{_mode(str(mode))}, projected, {_bandwidth(str(bw))}")
        fixed = result.get("config", {}).get("dim") if sweep == "workers" else result.get("reference_workers")
        other = "dim" if sweep == "workers" else "workers"
        for mode in modes:
            pts = sorted((m[key], m["samples_per_s"]) for m in measured if m.get("mode") == mode and key in m
                         and (fixed is None or m.get(other) == fixed))
            if pts:
                ax.plot(*zip(*pts), "o", color=colors[mode], ms=8, mec="black",
                        label=f"{_mode(str(mode))}, measured here")
        xs = sorted({p[key] for p in rows} | {m[key] for m in measured if key in m})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if xs:
            ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        projected_at = next((p.get(other) for p in rows), "?")
        ax.set_xlabel("workers" if sweep == "workers" else "embedding dim (floats per row)")
        ax.set_ylabel("samples/s (all workers)")
        ax.set_title(f"Throughput vs {sweep}: projected at {other} {projected_at}, measured at {fixed}",
                     fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


PLOTTERS = {"e2e": plot_e2e, "staleness": plot_staleness, "missrate": plot_missrate, "scale": plot_scale}


def write_plots(records: dict[str, dict], img_dir: str) -> dict[str, str]:
    """A PNG per measured record into ``img_dir``; the paths written, by name."""
    written = {}
    for name, plot in PLOTTERS.items():
        record = records.get(name) or {}
        if record.get("result") is None:
            continue
        path = os.path.join(img_dir, PLOTS[name])
        try:
            plot(record["result"], path)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a result of another shape
            print(f"het bench report: no plot for {name} ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        written[name] = path
    return written
