"""maintain: leased periodic sweeps — re-drive stuck drawers, fail exhausted ones, decay, prune."""
