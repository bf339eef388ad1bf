"""The report: pure functions of the study's result files and data frames (it imports only the ground floor,
never the engine, the models or the study steps). tables: a run's records and per-mode aggregates; thesis: the
thesis's tables beside ours; summary_json: summary.json; peers, sampling: the side studies' numbers; micro: notebook
02's floor and breakdown tables; figures, headline: figures and the closing lines of `make reproduce`.

The tables and summary.json's functions are gathered here too (`from lib import report`); figures is not (it
loads matplotlib and seaborn)."""
from .peers import table as peers_table
from .sampling import against_greedy, sampled_rows
from .summary_json import (acceptance_note, closing_checks, cost_model_section, extra_summary, run_source,
                           summary, write_summary)
from .tables import (acceptance_by_group, acceptance_counts, adaptive_tables, aggregate, block_policies, call_counts,
                     divergence_points, exact_match_rates, identities, kernel_of, overlap, records_frame, run_kernels,
                     ttft_outliers)
from .thesis import (diagnosis, draft_path, e2e_tables, micro_tables, save_tables, side_by_side, speedups,
                     thesis_consistency, thesis_modes)

__all__ = ["acceptance_by_group", "acceptance_counts", "acceptance_note", "adaptive_tables", "against_greedy",
           "aggregate", "block_policies", "call_counts", "closing_checks", "cost_model_section", "diagnosis",
           "divergence_points", "draft_path", "e2e_tables", "exact_match_rates", "extra_summary", "identities",
           "kernel_of", "micro_tables", "overlap", "peers_table", "records_frame", "run_kernels", "run_source",
           "sampled_rows", "save_tables", "side_by_side", "speedups", "summary", "thesis_consistency", "thesis_modes",
           "ttft_outliers", "write_summary"]
