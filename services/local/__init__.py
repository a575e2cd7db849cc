"""`rlrun local`: the four services as local processes on loopback, supervised by one launcher."""
