"""Span discovery in O(log n) (issue 39): servers publish expiring, signed records of what they serve, keyed by
model and first block, on the Kademlia peers closest to the key; a client looks up the blocks it needs when it
needs them (Petals' DHT records, Borzunov et al. 2023, section 3.2; Kademlia, Maymounkov & Mazières 2002)."""
