module tuna.test/node-images

go 1.26.8
