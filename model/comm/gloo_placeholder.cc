// Placeholder; delete when model/comm/gloo_communicator.cc lands.
