"""Opening a session and its state: the inputs checked, the environment made, the journal opened
or reopened and folded into what the decisions read, the reference and the verdict store's part."""
