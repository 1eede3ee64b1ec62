"""The drafter training library: data, the teacher, the losses, trees, the one loop, the paired experiment."""
