#include <convnn/nn/modules/convnn.h>
#include <iostream>
int main() {
  convnn::nn::ConvNN2d m(convnn::nn::ConvNN2dOptions(3, 8, 9).padding(1));
  std::cout << m << "\n" << m(torch::randn({2, 3, 6, 5})).sizes() << "\n";
}
