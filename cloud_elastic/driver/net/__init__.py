"""The driver's two servers, the control plane and the rendezvous store, and what they share against hostile clients."""
