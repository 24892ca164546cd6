class M(Module):
  def forward(self, x: Tensor) -> Tensor:
    return ((((((((((((((((((((((((((((((x)))))))))))))))))))))))))))))) + "((" # )
