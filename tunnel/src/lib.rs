//! tuna-tunnel (placeholder until its issue lands; see DESIGN.md §2).
