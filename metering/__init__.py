"""GPU-seconds accounting: what each attempt and job has used, from the ledger's attempts."""
