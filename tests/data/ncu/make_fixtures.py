"""Writes the SYNTHETIC ncu raw-CSV fixtures of this folder (see README.md): the layout of
``ncu --csv --page raw --print-units base``, numbers derived by hand from the kernels' geometry and the
figures recorded in benchmarks/results/peers-2026-11-29.md. Replace with real captures from the GPU."""

import csv
import io
from pathlib import Path

from tuner.ncu import ID_COLUMNS, METRICS

UNITS = {
    "gpu__time_duration.sum": "nsecond",
    "launch__registers_per_thread": "register/thread",
    "launch__occupancy_limit_registers": "block",
}


def unit(metric):
    if metric in UNITS:
        return UNITS[metric]
    if metric.startswith(("dram__bytes", "l1tex__t_bytes")):
        return "byte"
    if metric.endswith((".pct", "pct_of_peak_sustained_elapsed", "pct_of_peak_sustained_active")):
        return "%"
    if "sectors" in metric:
        return "sector"
    if "requests" in metric:
        return "request"
    if "inst" in metric or "conflicts" in metric:
        return ""
    return ""


def fmt(value):
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.2f}"


def write(name, kernels):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    w.writerow([*ID_COLUMNS, *METRICS])
    w.writerow([""] * len(ID_COLUMNS) + [unit(m) for m in METRICS])
    for i, (kernel, block, grid, values) in enumerate(kernels):
        w.writerow(
            [
                str(i),
                "4242",
                "python3",
                "127.0.0.1",
                kernel,
                "1",
                "13",
                block,
                grid,
                "0",
                "9.0",
                *(fmt(values.get(m, 0)) for m in METRICS),
            ]
        )
    text = (
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
        + buf.getvalue()
        + "==PROF== Disconnected from process 4242\n"
    )
    Path(__file__).with_name(name).write_text(text)


base = {"launch__occupancy_limit_registers": 8, "sm__maximum_warps_per_active_cycle_pct": 100.0}
N = 67108864  # copy n64M
write(
    "copy_stride8.csv",
    [
        (
            "copy_stride8_vec1_block256_items4",
            "(256, 1, 1)",
            "(65536, 1, 1)",
            {
                **base,
                "gpu__time_duration.sum": 577_000,
                "dram__bytes_read.sum": 32 * N + 1_048_576,
                "dram__bytes_write.sum": 4 * N,
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": 86.4,
                "lts__throughput.avg.pct_of_peak_sustained_elapsed": 61.0,
                "l1tex__throughput.avg.pct_of_peak_sustained_active": 38.0,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 9.5,
                "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 0.4,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": N,
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": N // 32,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": N // 8,
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": N // 32,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": 12.5,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": 100.0,
                "lts__t_sector_hit_rate.pct": 11.8,
                "sm__warps_active.avg.pct_of_peak_sustained_active": 88.1,
                "launch__registers_per_thread": 16,
            },
        )
    ],
)

E = 16384 * 16384  # transpose n16384
write(
    "transpose_pad0_vec1.csv",
    [
        (
            "transpose_tile32_rpt8_pad0_vec1",
            "(32, 4, 1)",
            "(512, 512, 1)",
            {
                **base,
                "gpu__time_duration.sum": 1_229_000,
                "dram__bytes_read.sum": 4 * E + 2_000_000,
                "dram__bytes_write.sum": 4 * E,
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": 37.0,
                "lts__throughput.avg.pct_of_peak_sustained_elapsed": 33.0,
                "l1tex__throughput.avg.pct_of_peak_sustained_active": 93.5,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 46.0,
                "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 1.0,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": E // 8,
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": E // 32,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": E // 8,
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": E // 32,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": 100.0,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": 100.0,
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": 31 * (E // 32),
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": 0,
                "smsp__inst_executed_op_shared_ld.sum": E // 32,
                "smsp__inst_executed_op_shared_st.sum": E // 32,
                "lts__t_sector_hit_rate.pct": 51.6,
                "sm__warps_active.avg.pct_of_peak_sustained_active": 90.2,
                "launch__registers_per_thread": 22,
            },
        )
    ],
)

G = 4096**3
write(
    "gemm_lb8_spills.csv",
    [
        (
            "gemm_tm128_tn128_tk16_rm8_rn8_pad4_vec4_lb8_fuse3_st2",
            "(256, 1, 1)",
            "(32, 32, 1)",
            {
                "launch__occupancy_limit_registers": 8,
                "sm__maximum_warps_per_active_cycle_pct": 100.0,
                "gpu__time_duration.sum": 9_650_000,
                "dram__bytes_read.sum": 2_900_000_000,
                "dram__bytes_write.sum": 1_400_000_000,
                "dram__throughput.avg.pct_of_peak_sustained_elapsed": 9.3,
                "lts__throughput.avg.pct_of_peak_sustained_elapsed": 55.0,
                "l1tex__throughput.avg.pct_of_peak_sustained_active": 88.0,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 52.0,
                "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 21.0,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 1_090_519_040,
                "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 68_157_440,
                "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": 2_097_152,
                "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": 131_072,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": 100.0,
                "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": 100.0,
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": 0,
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": 0,
                "smsp__inst_executed_op_shared_ld.sum": 2_147_483_648,
                "smsp__inst_executed_op_shared_st.sum": 134_217_728,
                "lts__t_sector_hit_rate.pct": 71.5,
                "sm__warps_active.avg.pct_of_peak_sustained_active": 93.0,
                "launch__registers_per_thread": 32,
                "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": 48_000_000_000,
                "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": 21_000_000_000,
                "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": G,
                "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 16_777_216,
                "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 50_331_648,
            },
        )
    ],
)

B = 32768 * 8192  # elementwise bf16 r32768_c8192


def chain_kernel(name, seconds_ns, has_bias):
    return (
        name,
        "(256, 1, 1)",
        "(32768, 1, 1)",
        {
            **base,
            "gpu__time_duration.sum": seconds_ns,
            "dram__bytes_read.sum": 2 * B + (16384 if has_bias else 0) + 524_288,
            "dram__bytes_write.sum": 2 * B,
            "dram__throughput.avg.pct_of_peak_sustained_elapsed": 89.0,
            "lts__throughput.avg.pct_of_peak_sustained_elapsed": 42.0,
            "l1tex__throughput.avg.pct_of_peak_sustained_active": 21.0,
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": 30.0,
            "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 9.0,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": B // 16,
            "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": B // 256,
            "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": B // 16,
            "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": B // 256,
            "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": 100.0,
            "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": 100.0,
            "lts__t_sector_hit_rate.pct": 1.2,
            "sm__warps_active.avg.pct_of_peak_sustained_active": 84.0,
            "launch__registers_per_thread": 56,
            "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": 4 * B,
            "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": 2 * B,
            "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": 4 * B,
        },
    )


uri = "elementwise_fuse{}_vec8_t256_it4_mb4_hintstream_mathtanh"
write("elementwise_fusion3.csv", [chain_kernel(uri.format(3), 254_500, True)])
write(
    "elementwise_fusion1.csv",
    [
        chain_kernel(uri.format(1), 259_000, True),
        chain_kernel(uri.format(1) + "_gelu", 258_000, False),
        chain_kernel(uri.format(1) + "_scale", 257_000, False),
    ],
)
