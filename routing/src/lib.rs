//! tuna-routing (placeholder until its issue lands; see DESIGN.md §2).
