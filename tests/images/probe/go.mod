module socialweb.local/probe

go 1.24
