"""Distribution: dense synchronisation (AllReduce or PS) and launching a local cluster."""
