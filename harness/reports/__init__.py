"""Reports: the simulator's, the real runs', the cluster logs', the papers' claims and the statistics behind them."""
