"""The Gluon MoE's launch choices (moe/gluon.py's fused_moe_gluon reads them at each launch): the
token tile by the slots an expert gets, the ring's depth, 64-row weight tiles a program, K splits,
the copy-warp loop, ragged tiles and register caps, each with the measurement that chose it.
Benchmarks flip some of them for their A/Bs (bench_decode.py's variants), so the launch reads them
here, through the module, rather than copies of its own."""

from __future__ import annotations

# Token tile by the slots an expert gets on average (T * top_k / E), as in swapped.py, and the
# ring's depth (k_loop's STAGES, >= 2) by tile. H100, bench_moe_gluon.py: 8 up to 4 slots (a wgmma
# of N = 8: 20b T=32 176.0 vs 179.4 us with 16, 120b T=128 635.3 vs 659.6; at 8 slots 16 wins,
# 183.5 vs 213.4), 16 up to 8 slots (4 stages), 32 up to 32 slots, 64 above (3 stages: 4 leave
# room for fewer programs per SM).
BLOCK_T_BY_SLOTS = {4: 8, 8: 16, 32: 32, 1 << 30: 64}
STAGES_BY_BLOCK_T = {8: 4, 16: 4, 32: 3, 64: 3}
# Split K only below one program per SM: with the ring, a batch-1 layer's 180 programs per GEMM
# stream as fast unsplit (20b: 45.9 vs 48.3 us at 2 per SM, which also launched the split sum).
PROGRAMS_PER_SM = 1
# The down GEMM's splits cost no extra pass (sum_experts adds them): at batch 1 its 180 programs
# split in two run faster (20b 45.8 -> 44.3 us a layer, 120b 49.7 -> 47.2; 3 and 4 per SM slower).
DOWN_PROGRAMS_PER_SM = 2
# 64-row gate/up tiles per program by token tile. One doubles the programs (batch 1: 360 for 132
# SMs instead of 180) and shortens each K step's chain; two share each activation step between two
# MMAs, which pays once the activation tile is the larger read. H100, bench_moe_gluon.py, one tile
# vs two: 20b T=1 40.8 vs 44.5 us, T=8 177.4 vs 182.5, T=32 239.3 vs 243.5 (16-token tiles); T=256
# 326.2 vs 316.9 (32), T=1024 863.4 vs 790.9 (64); 120b T=256 991.7 vs 1001.2 (16), T=1024 1504.5
# vs 1458.7 (32).
GATE_UP_TILES_BY_BLOCK_T = {8: 1, 16: 1, 32: 2, 64: 2}
# 64-row down tiles a program by token tile, as GATE_UP_TILES_BY_BLOCK_T: 2 share each step's
# activation copies between two MMAs (hidden = 2880 is 45 tiles: the last program's second repeats
# its first and stores nothing). H200, benchmarks/diag/moe_tiles.py --kernels, the down kernel's µs
# a layer, one tile vs two (2026-11-27): 20b T=256 (32-token tiles) 122.7 vs 116.5, T=2304 (64)
# 686.1 vs 498.5; 120b T=512 (32) 296.7 vs 255.0, T=256 (16) 239.7 vs 219.9. The 16-token tiles keep
# one: the whole layer (H100, moe_tiles.py, 2026-11-27, µs, one tile / two / 32-token ragged tiles
# with two) 20b T=40-64 173-176 / 183-184 / 181-182, 120b T=160 639 / 645 / 655, T=192 640 / 653 /
# 664, T=256 668 / 663 / 673.
DOWN_TILES_BY_BLOCK_T = {8: 1, 16: 1, 32: 2, 64: 2}
# The K loops with a copy warp (moe/gluon_ws.py) where the gate/up grid is at most WS_PROGRAMS_PER_SM
# programs an SM by used_tiles' bound (8- and 16-token tiles, one tile a program): batch 1 (450 on 132
# SMs) and 2 (810), not 4 (1,620). H100, bench_moe_gluon.py --ab-ws, µs a layer with / without: 20b
# T=1 34.4 / 35.9, T=2 55.0 / 67.6; 120b T=1 38.0 / 39.2, T=2 58.5 / 72.1. Forced at every size, it
# lost from 8 tokens on (20b T=32 179.3 / 165.8, 120b T=8 170.9 / 160.6), where the grid runs several
# waves of three programs an SM (H100, 2026-11-24; benchmarks/NOTES-moe.md).
WS_BLOCK_T = (8, 16)
WS_PROGRAMS_PER_SM = 8
COPY_WARP = True  # the switch bench_decode.py --ab copy-warp flips; read at launch
# Ragged token tiles (the kernels' RAGGED): an expert's last tile whose second half holds no slot runs
# at half its rows, so the experts just over a tile's worth do not pay a full second tile. H100,
# benchmarks/diag/moe_tiles.py (uniform routing, µs a layer, plain / ragged, 2026-11-26): 32-token
# tiles, 120b T=384 764.8 / 704.1, T=512 785.5 / 745.6, T=256 733.0 / 676.0, 20b T=256 273.4 /
# 267.5, T=128-192 level; 64-token tiles, 20b T=128 298.9 / 226.0, T=256 302.3 / 272.6, T=320-2304
# level (their last tiles hold more than 32 slots).
RAGGED_BLOCK_T: tuple[int, ...] = (32, 64)
# Register caps (ptxas' maxnreg) of the cp.async kernels by token tile, (gate/up, down): None lets
# ptxas choose. Registers decide how many programs an SM holds (65,536 / (128 x registers));
# benchmarks/diag/gluon_resources.py prints both and the spills. The 64-token down GEMM takes 174
# registers uncapped (2 programs an SM), 168 capped (3; 8 bytes of stack). H100, moe_tiles.py, µs a
# layer, uncapped / capped (2026-11-26): 20b T=320 305.1 / 292.0, T=384 311.6 / 298.5, T=2304 1647.2 /
# 1553.1 (the default then: 1569.5). Not kept: down at 32-token tiles capped at 100 (103 -> 99
# registers, 4 -> 5 programs an SM: level), gate/up capped at 128 (32-token) or 168 (64-token; with
# 3 stages shared memory still allows only 2 programs an SM): 10-40% slower, they spill. The down
# caps hold for one tile a program (DOWN_TILES_BY_BLOCK_T): two run uncapped (at 168 the 64-token
# one spills 368 bytes, and its 79 KB of shared memory allow 2 programs an SM anyway).
MAX_REGISTERS_BY_BLOCK_T: dict[int, tuple[int | None, int | None]] = {64: (None, 168)}
