class OperatorClustering: pass
