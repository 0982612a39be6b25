module sandbox

go 1.24
