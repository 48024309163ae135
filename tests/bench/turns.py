"""Decode engines taking turns: on a machine shared with other work, the
memory bandwidth a decode sees moves by a fifth to a third between runs a
minute apart, so that two engines measured one after the other compare
their moments as much as themselves.  This runs them side by side, idle
but for their turn: each prefills in turn, then each decodes N/R tokens,
R rounds, ours and theirs alternating, with CB_BENCH_TURNS=R set (see
bench_engine.c), each turn SETTLE seconds after the last one ended.
Every line an engine prints goes, prefixed with "SCENARIO/", to its file
(appended), as run.sh's engine_rows collects them; it adds
decode_L_turn_ratio to the first file: the median over the rounds of
first engine's rate over the last's.
usage: turns.py SCENARIO ROUNDS OUT1 ... OUTk -- CMD1... -- ... -- CMDk..."""
import os
import statistics
import subprocess
import sys
import time

# Seconds between one engine's turn and the next: an engine's threads may
# spin for a while after its work (libgomp's, under llama.cpp, for
# milliseconds), and the engine whose turn came next paid for it: the same
# binary decoded SmolLM2 at 75-86 tok/s in the turn after llama.cpp's and
# at 104-115 in the turn after another of ours.
SETTLE = 0.05


def main():
    sc, rounds = sys.argv[1], int(sys.argv[2])
    rest = sys.argv[3:]
    outs = rest[:rest.index("--")]
    cmds, cur = [], None
    for a in rest[len(outs):]:
        if a == "--":
            cur = []
            cmds.append(cur)
        else:
            cur.append(a)
    if len(cmds) != len(outs) or not all(cmds):
        sys.exit("turns.py: one command for each output file")
    env = dict(os.environ, CB_BENCH_TURNS=str(rounds))
    procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for c in cmds]
    lines = [[] for _ in procs]
    times = [[] for _ in procs]

    def turn(k, want):
        """let engine k go; collect its lines until one starts with want"""
        p = procs[k]
        time.sleep(SETTLE)
        p.stdin.write("go\n")
        p.stdin.flush()
        for ln in p.stdout:
            lines[k].append(ln)
            if ln.startswith(want):
                if want == "turn_s":
                    times[k].append(float(ln.split()[1]))
                return
        sys.exit(f"turns.py: {' '.join(cmds[k])} ended before its turn was over")

    for k in range(len(procs)):
        turn(k, "prefill_")
    for _ in range(rounds):
        for k in range(len(procs)):
            turn(k, "turn_s")
    for k, p in enumerate(procs):
        p.stdin.close()
        lines[k].append(p.stdout.read())
        if p.wait():
            sys.exit(f"turns.py: {' '.join(cmds[k])} exited {p.returncode}")
    L = sc.split(":")[1]
    ratios = [b / a for a, b in zip(times[0], times[-1]) if a > 0]
    lines[0].append(f"decode_{L}_turn_ratio {statistics.median(ratios):.3f}\n")
    for k, path in enumerate(outs):
        with open(path, "a") as f:
            for ln in "".join(lines[k]).splitlines():
                if not ln.startswith("turn_s"):
                    f.write(f"{sc}/{ln}\n")


main()
