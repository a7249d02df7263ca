"""Loading: what the user named becomes the files of one model, each parsed from the source
that serves it, and the whole files that files/ serves.  Above sources/.
"""
