"""Wire and storage formats shared by broker and client: pure functions, no I/O."""
