module github.com/hopper-sidecar/hopper

go 1.26

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	github.com/valyala/fasthttp v1.74.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/molecule-man/go-brrr v1.0.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
)
