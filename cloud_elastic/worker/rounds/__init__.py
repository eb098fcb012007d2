"""One round's process group: forming it on the signed rendezvous store, abandoning it, reclaiming what it held."""
